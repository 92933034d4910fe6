"""Models. Importing this package registers every backbone and neck in :data:`mmplugin.registry.MODELS`."""
from .backbones import SwiftFormer, SwinTransformer, SwinTransformerV2
from .necks import GlobalAttentionNeck

__all__ = ['SwiftFormer', 'SwinTransformer', 'SwinTransformerV2', 'GlobalAttentionNeck']
