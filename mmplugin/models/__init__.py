"""Models. Importing this package registers every backbone in :data:`mmplugin.registry.MODELS`."""
from .backbones import SwiftFormer, SwinTransformer, SwinTransformerV2

__all__ = ['SwiftFormer', 'SwinTransformer', 'SwinTransformerV2']
