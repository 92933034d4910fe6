"""Layers shared by the backbones."""
from mmplugin.models.layers.drop import DropPath, linear_drop_path_rates
from mmplugin.models.layers.fusion import (
    all_finite,
    bn_scale_shift,
    can_fuse_onednn,
    conv_act,
    conv_add,
    conv_bn,
    folded_bn_conv1x1,
    folded_conv_bn,
    fuse_bn_conv1x1,
    fuse_conv_bn,
    onednn_fusion_disabled,
    scale_output_,
    uses_running_stats,
)
from mmplugin.models.layers.init import transformer_init_

__all__ = [
    'DropPath', 'linear_drop_path_rates', 'all_finite', 'bn_scale_shift', 'can_fuse_onednn', 'conv_act', 'conv_add',
    'conv_bn',
    'folded_bn_conv1x1', 'folded_conv_bn', 'fuse_bn_conv1x1', 'fuse_conv_bn', 'onednn_fusion_disabled', 'scale_output_',
    'uses_running_stats',
    'transformer_init_'
]
