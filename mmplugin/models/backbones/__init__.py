"""Backbones registered under the ``mmplugin`` scope."""
from .base import BaseBackbone
from .efficientformer import EfficientFormer
from .poolformer import PoolFormer
from .registry import FAMILIES, detect_family, get_family
from .swiftformer import SwiftFormer
from .swin import SwinTransformer, SwinTransformerV2

__all__ = [
    'BaseBackbone', 'FAMILIES', 'detect_family', 'get_family', 'SwiftFormer', 'SwinTransformer', 'SwinTransformerV2',
    'EfficientFormer', 'PoolFormer'
]
