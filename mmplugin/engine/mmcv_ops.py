"""mmcv's compiled CPU kernels (NMS, RoIAlign) take fp32 only, so an fp16 / bf16 autocast forward of a whole
detector on the CPU stops in the RPN ("expected scalar type Float but found Half"); their CUDA kernels take half
precision, which is why AMP works there. :func:`install_cpu_reduced_precision_ops` lets those kernels run on fp16 /
bf16 CPU tensors: the floating-point arguments are copied to fp32, the kernel runs, and the tensors it wrote are
rounded back into the caller's. Inputs are only read (they keep their autograd version). CUDA tensors and fp32 /
fp64 calls go to the kernels untouched.
"""
from __future__ import annotations

import functools

import torch

from mmplugin.models.layers.precision import REDUCED_DTYPES

__all__ = ['CPU_FP32_ONLY_KERNELS', 'install_cpu_reduced_precision_ops']

# the kernels of mmcv.ops that mmdet's / mmseg's heads call during a training or test step -> the positions of
# the tensors they write (mmcv.ops.roi_align passes every tensor positionally)
CPU_FP32_ONLY_KERNELS = {'nms': (), 'roi_align_forward': (2, 3, 4), 'roi_align_backward': (4, )}


def _in_fp32_on_cpu(kernel, written: tuple[int, ...]):
    @functools.wraps(kernel)
    def run(*args, **kwargs):
        if not any(isinstance(a, torch.Tensor) and a.device.type == 'cpu' and a.dtype in REDUCED_DTYPES
                   for a in (*args, *kwargs.values())):
            return kernel(*args, **kwargs)
        up = [a.float() if isinstance(a, torch.Tensor) and a.dtype in REDUCED_DTYPES else a for a in args]
        out = kernel(*up, **kwargs)
        for i in written:
            if up[i] is not args[i]:
                args[i].copy_(up[i])
        return out
    run.__mmplugin_fp32__ = True
    return run


def install_cpu_reduced_precision_ops() -> bool:
    """Wrap :data:`CPU_FP32_ONLY_KERNELS` of mmcv's extension once (idempotent); False if mmcv has no ops."""
    try:
        from mmcv.utils import ext_loader
        ext = ext_loader.load_ext('_ext', list(CPU_FP32_ONLY_KERNELS))
    except (ImportError, AssertionError):
        return False
    for name, written in CPU_FP32_ONLY_KERNELS.items():
        kernel = getattr(ext, name)
        if not getattr(kernel, '__mmplugin_fp32__', False):
            setattr(ext, name, _in_fp32_on_cpu(kernel, written))
    return True
