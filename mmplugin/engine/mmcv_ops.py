"""mmcv's compiled CPU kernels (NMS, RoIAlign) take fp32 only, so an fp16 / bf16 autocast forward of a whole
detector on the CPU stops in the RPN ("expected scalar type Float but found Half"); their CUDA kernels take half
precision, which is why AMP works there. :func:`install_cpu_reduced_precision_ops` lets those kernels run on fp16 /
bf16 CPU tensors: the floating-point arguments are copied to fp32, the kernel runs, and the tensors it wrote are
rounded back into the caller's. Inputs are only read (they keep their autograd version). CUDA tensors and fp32 /
fp64 calls go to the kernels untouched.

Where mmcv has no compiled ops at all (``mmcv-lite``, a machine that cannot build them),
:func:`install_torchvision_kernels` serves mmcv's NMS and RoIAlign from torchvision's kernels, so mmdet's detectors
train and test there (``tools/gpu_check.py`` uses it on a lent GPU machine that has torch and torchvision only).
"""
from __future__ import annotations

import functools
import types

import torch

from mmplugin.models.layers.precision import REDUCED_DTYPES

__all__ = ['CPU_FP32_ONLY_KERNELS', 'TORCHVISION_KERNELS', 'install_cpu_reduced_precision_ops',
           'install_torchvision_kernels']

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


# mmcv's kernels that torchvision also has, with the same arithmetic: NMS (offset 0: boxes measured x2 - x1) and
# average-pooled RoIAlign (the same bilinear sampling, adaptive sampling grid and half-pixel ``aligned`` shift; mmcv's
# own ``RoIAlign(use_torchvision=True)`` switches to it)
TORCHVISION_KERNELS = ('nms', 'roi_align_forward', 'roi_align_backward')


def _tv_nms(boxes, scores, iou_threshold: float, offset: int = 0):
    if offset != 0:
        raise NotImplementedError(f'NMS with offset={offset} has no torchvision kernel (only offset 0)')
    return torch.ops.torchvision.nms(_fp32(boxes), _fp32(scores), float(iou_threshold))


def _fp32(t: torch.Tensor) -> torch.Tensor:
    """Reduced-precision tensors in fp32: torchvision's kernels take fp16 at most, and its backward kernels run
    outside autocast (which casts their forwards), so bf16 features and gradients are computed in fp32 and the
    results rounded into the caller's tensors."""
    return t.float() if t.dtype in REDUCED_DTYPES else t


def _tv_roi_align_forward(input, rois, output, argmax_y, argmax_x, *, aligned_height: int, aligned_width: int,
                          spatial_scale: float, sampling_ratio: int, pool_mode: int, aligned: bool):
    if pool_mode != 1:
        raise NotImplementedError('max-pooled RoIAlign has no torchvision kernel (only pool_mode="avg")')
    output.copy_(torch.ops.torchvision.roi_align(_fp32(input), _fp32(rois), float(spatial_scale), int(aligned_height),
                                                 int(aligned_width), int(sampling_ratio), bool(aligned)))


def _tv_roi_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input, *, aligned_height: int,
                           aligned_width: int, spatial_scale: float, sampling_ratio: int, pool_mode: int,
                           aligned: bool):
    if pool_mode != 1:
        raise NotImplementedError('max-pooled RoIAlign has no torchvision kernel (only pool_mode="avg")')
    n, c, h, w = grad_input.shape
    grad_input.copy_(torch.ops.torchvision._roi_align_backward(
        _fp32(grad_output), _fp32(rois), float(spatial_scale), int(aligned_height), int(aligned_width), n, c, h, w,
        int(sampling_ratio), bool(aligned)))


class _TorchvisionExt(types.ModuleType):
    """Stands in for ``mmcv._ext``: :data:`TORCHVISION_KERNELS` run on torchvision's kernels; any other kernel
    exists (``mmcv.ops`` checks the names at import) but raises ``NotImplementedError`` naming itself when called."""

    def __getattr__(self, name: str):
        if name.startswith('__'):
            raise AttributeError(name)

        def missing(*args, **kwargs):
            raise NotImplementedError(f"mmcv was installed without its compiled ops and torchvision has no '{name}' "
                                      f'kernel; only {", ".join(TORCHVISION_KERNELS)} run here (build mmcv with its '
                                      'ops: tools/setup_env.sh)')
        missing.__name__ = name
        return missing


def install_torchvision_kernels() -> bool:
    """Where mmcv was installed without its compiled ops (``mmcv-lite``, or a machine where they cannot be built),
    let ``mmcv.ops`` import and run NMS and RoIAlign on torchvision's kernels (CPU and CUDA, fp32 / fp16 / bf16):
    enough for mmdet's two-stage detectors (RPN, RoI heads, mask targets) and their losses.

    Call it before ``mmcv.ops`` is first imported. Returns False and changes nothing where mmcv has its own
    compiled extension; True once the stand-in is installed. Raises ``ImportError`` when neither exists.
    """
    import importlib.util
    import sys
    if 'mmcv._ext' in sys.modules:
        return isinstance(sys.modules['mmcv._ext'], _TorchvisionExt)
    if importlib.util.find_spec('mmcv._ext') is not None:
        return False
    try:
        import torchvision  # noqa: F401  (registers torch.ops.torchvision)
    except ImportError as err:
        raise ImportError('mmcv has no compiled ops and torchvision is not importable: build mmcv with its ops '
                          '(tools/setup_env.sh) or install a torchvision matching this torch') from err
    import importlib.machinery
    ext = _TorchvisionExt('mmcv._ext', doc=_TorchvisionExt.__doc__)
    # a spec without a loader: ``pkgutil.find_loader('mmcv._ext')`` (mmengine's ``mmcv_full_available``, used by the
    # optimizer constructors) answers "no full ops" instead of raising on a module whose spec is None
    ext.__spec__ = importlib.machinery.ModuleSpec('mmcv._ext', None)
    ext.get_compiler_version = ext.get_compiling_cuda_version = lambda: 'n/a (kernels from torchvision)'
    ext.nms = _tv_nms
    ext.roi_align_forward = _tv_roi_align_forward
    ext.roi_align_backward = _tv_roi_align_backward
    sys.modules['mmcv._ext'] = ext
    return True
