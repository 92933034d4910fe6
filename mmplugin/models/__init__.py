"""Models. Importing this package registers every backbone, neck, RoI operator and test-time augmentation wrapper
in :data:`mmplugin.registry.MODELS`."""
from mmplugin.models.backbones import EfficientFormer, PoolFormer, SwiftFormer, SwinTransformer, SwinTransformerV2
from mmplugin.models.necks import GlobalAttentionNeck
from mmplugin.models.roi_extractors import roi_align_layer, single_roi_extractor
from mmplugin.models.tta import MaskDetTTAModel

__all__ = ['EfficientFormer', 'PoolFormer', 'SwiftFormer', 'SwinTransformer', 'SwinTransformerV2',
           'GlobalAttentionNeck', 'MaskDetTTAModel', 'roi_align_layer', 'single_roi_extractor']
