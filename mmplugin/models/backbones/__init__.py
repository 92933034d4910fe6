"""Backbones registered under the ``mmplugin`` scope."""
from mmplugin.models.backbones.base import BaseBackbone
from mmplugin.models.backbones.efficientformer.model import EfficientFormer
from mmplugin.models.backbones.poolformer.model import PoolFormer
from mmplugin.models.backbones.registry import FAMILIES, detect_family, get_family
from mmplugin.models.backbones.swiftformer.model import SwiftFormer
from mmplugin.models.backbones.swin.model import SwinTransformer, SwinTransformerV2

__all__ = [
    'BaseBackbone', 'FAMILIES', 'detect_family', 'get_family', 'SwiftFormer', 'SwinTransformer', 'SwinTransformerV2',
    'EfficientFormer', 'PoolFormer'
]
