"""Inference-time options applied to a built model (reduced precision, torch.compile)."""
from mmplugin.inference.fast import (
    FAST_MODES,
    compile_backbone_and_neck,
    compile_module,
    enable_fast_inference,
    native_dtypes,
    native_low_precision,
)

__all__ = ['FAST_MODES', 'compile_backbone_and_neck', 'compile_module', 'enable_fast_inference', 'native_dtypes',
           'native_low_precision']
