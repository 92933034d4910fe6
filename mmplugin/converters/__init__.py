"""Checkpoint conversion as pure functions, shared by the backbones and ``tools/convert_checkpoint.py``."""
from .common import LoadPlan, plan_load, rename_keys, strip_prefixes, unwrap_state_dict
from .swiftformer import convert_swiftformer, detect_swiftformer_layout

__all__ = [
    'LoadPlan', 'plan_load', 'rename_keys', 'strip_prefixes', 'unwrap_state_dict', 'convert_swiftformer',
    'detect_swiftformer_layout'
]
from .swin import convert_swin, detect_swin_layout, detect_swin_version, resize_bias_table  # noqa: E402

__all__ += ['convert_swin', 'detect_swin_layout', 'detect_swin_version', 'resize_bias_table']
