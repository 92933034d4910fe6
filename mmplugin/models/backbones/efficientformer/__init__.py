"""EfficientFormer (V1), the SwiftFormer paper's comparison row.

* :mod:`.model`: :class:`EfficientFormer` (registered backbone) with the dense-prediction attention bias grid;
* :mod:`.converter`: official ImageNet / dense and mmpretrain layouts to the plugin's.
"""
from __future__ import annotations

from mmplugin.models.backbones.efficientformer.converter import (
    convert_efficientformer,
    detect_efficientformer_layout,
    is_efficientformer,
)
from mmplugin.models.backbones.efficientformer.model import EfficientFormer

__all__ = ['convert_efficientformer', 'detect_efficientformer_layout', 'is_efficientformer', 'EfficientFormer']
