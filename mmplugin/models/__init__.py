"""Models. Importing this package registers every backbone, neck and test-time augmentation wrapper in
:data:`mmplugin.registry.MODELS`."""
from .backbones import EfficientFormer, PoolFormer, SwiftFormer, SwinTransformer, SwinTransformerV2
from .necks import GlobalAttentionNeck
from .tta import MaskDetTTAModel

__all__ = ['EfficientFormer', 'PoolFormer', 'SwiftFormer', 'SwinTransformer', 'SwinTransformerV2', 'GlobalAttentionNeck', 'MaskDetTTAModel']
