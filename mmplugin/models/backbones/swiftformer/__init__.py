"""SwiftFormer, in one place.

* :mod:`.model`: :class:`SwiftFormer` (registered backbone), its encoder blocks and stages;
* :mod:`.attention`: the efficient additive attention and its L2 normalisation;
* :mod:`.blocks`: the convolutional encoder, local representation and MLP blocks;
* :mod:`.converter`: the official release's layout (and the plugin's own) to the plugin's.
"""
from __future__ import annotations

from mmplugin.models.backbones.swiftformer.converter import convert_swiftformer, detect_swiftformer_layout
from mmplugin.models.backbones.swiftformer.model import SwiftFormer

__all__ = ['convert_swiftformer', 'detect_swiftformer_layout', 'SwiftFormer']
