"""PoolFormer, the SwiftFormer paper's comparison row.

* :mod:`.model`: :class:`PoolFormer` (registered backbone);
* :mod:`.converter`: official and mmpretrain layouts to the plugin's.
"""
from __future__ import annotations

from mmplugin.models.backbones.poolformer.converter import convert_poolformer, is_poolformer
from mmplugin.models.backbones.poolformer.model import PoolFormer

__all__ = ['convert_poolformer', 'is_poolformer', 'PoolFormer']
