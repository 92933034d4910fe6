"""Backbones registered under the ``mmplugin`` scope."""
from .base import BaseBackbone
from .swiftformer import SwiftFormer
from .swin import SwinTransformer, SwinTransformerV2

__all__ = ['BaseBackbone', 'SwiftFormer', 'SwinTransformer', 'SwinTransformerV2']
