"""RoIAlign for the RoI heads of Mask R-CNN, Cascade and HTC: the function of mmcv's ``RoIAlign`` (average pooling,
aligned or legacy coordinates, fixed or adaptive sampling grid), with a faster CPU kernel.

mmcv's CPU kernel runs on one thread and, in its backward, recomputes every sample's bilinear weights for every
channel; in a Swin-T Mask R-CNN training step on 2 threads its forward and backward take more time than the
backbone's forward. The kernel here (``roi_align.c``, built on first use by :mod:`mmplugin.ops.build`) computes the same
sums in separable form (rows first, then columns) and splits the channels over ``torch.get_num_threads()`` threads.
Outputs and gradients equal mmcv's up to the order of the fp32 sums; non-finite values propagate to the same outputs.

Everything the kernel does not cover goes to mmcv's own ``roi_align``, so a config behaves as with mmcv's layer:
max pooling, ``use_torchvision``, devices other than the CPU, tracing, ONNX and ``torch.export`` (mmdeploy's
rewriters apply), ``torch.compile``, and machines without a C compiler (with one warning). fp16 / bf16 CPU maps (CPU
autocast) are pooled in fp32 and rounded back, as :mod:`mmplugin.engine.mmcv_ops` runs mmcv's kernel.
"""
from __future__ import annotations

import ctypes
import functools
import warnings

import torch
from torch.autograd.function import once_differentiable
from torch.nn.modules.utils import _pair

from mmplugin.ops.build import KernelUnavailable, load_kernels
from mmplugin.ops.parallel import run_slices

__all__ = ['layer_class', 'roi_align', 'fast_kernel_applies']  # and RoIAlign (layer_class(), on first use)

_DTYPES = {torch.float32: 'f32', torch.float64: 'f64'}
_ARGS = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                                                       ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_warned = []  # the reason the kernel is unavailable, once known: not built again, warned once


def _kernels() -> ctypes.CDLL | None:
    """The built library, or None (warned once, not retried) where it cannot be built."""
    if _warned:
        return None
    try:
        lib = load_kernels('roi_align')
    except KernelUnavailable as e:
        _warned.append(str(e))
        warnings.warn(f'mmplugin.RoIAlign uses mmcv\'s kernel: {e}', stacklevel=3)
        return None
    for suffix in _DTYPES.values():
        for direction in ('forward', 'backward'):
            fn = getattr(lib, f'mmplugin_roi_align_{direction}{suffix}')
            fn.argtypes, fn.restype = _ARGS, ctypes.c_int
    return lib


def _run(direction: str, src: torch.Tensor, rois: torch.Tensor, dst: torch.Tensor, feature_shape, output_size,
         spatial_scale: float, sampling_ratio: int, aligned: bool) -> None:
    """One kernel call per channel slice, the slices on ``torch.get_num_threads()`` threads."""
    fn = getattr(_kernels(), f'mmplugin_roi_align_{direction}{_DTYPES[src.dtype]}')
    _, channels, height, width = feature_shape
    common = (src.data_ptr(), rois.data_ptr(), dst.data_ptr(), rois.shape[0], channels, height, width,
              output_size[0], output_size[1], spatial_scale, sampling_ratio, int(aligned))
    codes = run_slices(lambda begin, end: fn(*common, begin, end), channels)
    if 2 in codes:
        raise ValueError('RoIAlign(aligned=True) got a RoI of negative or NaN width or height (x2 < x1 or y2 < y1)')
    if 1 in codes:
        raise MemoryError('RoIAlign: out of memory for the sampling taps (or a RoI needs more than 2^31 of them)')


def _check(input: torch.Tensor, rois: torch.Tensor) -> None:
    if input.dim() != 4:
        raise ValueError(f'RoIAlign expects an (N, C, H, W) feature map, got shape {tuple(input.shape)}')
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f'RoIs must be (K, 5) rows of (batch index, x1, y1, x2, y2), got shape {tuple(rois.shape)}')
    if rois.shape[0] and input.shape[2] * input.shape[3] == 0:
        raise ValueError(f'RoIAlign got RoIs for an empty feature map of shape {tuple(input.shape)}')
    if rois.shape[0]:
        idx = rois[:, 0]
        ok = (idx >= 0) & (idx < input.shape[0]) & (idx == idx.floor())
        if not bool(ok.all()):
            raise ValueError(f'RoI batch indices must be integers in [0, {input.shape[0]}), got '
                             f'{idx[~ok][:5].tolist()}')


class _RoIAlignAvg(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, rois, output_size, spatial_scale, sampling_ratio, aligned):
        input, rois = input.contiguous(), rois.contiguous()
        out = input.new_empty((rois.shape[0], input.shape[1], *output_size))
        _run('forward', input, rois, out, input.shape, output_size, spatial_scale, sampling_ratio, aligned)
        ctx.save_for_backward(rois)
        ctx.args = (input.shape, output_size, spatial_scale, sampling_ratio, aligned)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        (rois, ) = ctx.saved_tensors
        grad_input = grad_out.new_zeros(ctx.args[0])
        _run('backward', grad_out.contiguous(), rois, grad_input, *ctx.args)
        return grad_input, None, None, None, None, None


def fast_kernel_applies(input: torch.Tensor, rois: torch.Tensor, pool_mode: str = 'avg') -> bool:
    """Whether :func:`roi_align` runs the plugin's kernel for these arguments (else mmcv's)."""
    return (pool_mode == 'avg' and input.device.type == 'cpu' and input.dtype in _DTYPES and rois.dtype == input.dtype
            and not (torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()
                     or torch.compiler.is_compiling() or torch.compiler.is_exporting())
            and _kernels() is not None)


def roi_align(input: torch.Tensor, rois: torch.Tensor, output_size, spatial_scale: float = 1.0,
              sampling_ratio: int = 0, pool_mode: str = 'avg', aligned: bool = True) -> torch.Tensor:
    """``mmcv.ops.roi_align`` with the same arguments: ``input`` ``(N, C, H, W)``, ``rois`` ``(K, 5)`` rows of
    ``(batch index, x1, y1, x2, y2)`` in input-image coordinates -> ``(K, C, out_h, out_w)``.

    Raises:
        ValueError: a map that is not 4-D, RoIs that are not ``(K, 5)`` or name an image outside the batch, or (with
            ``aligned``) a RoI of negative size, which mmcv refuses too.
    """
    output_size = _pair(output_size)
    if (input.device.type == 'cpu' and input.is_floating_point() and input.dtype not in _DTYPES
            and rois.dtype in (input.dtype, torch.float32)):
        # CPU autocast: the RoI features in fp32 and rounded back, as mmplugin.engine.mmcv_ops runs mmcv's kernel
        out = roi_align(input.float(), rois.float(), output_size, spatial_scale, sampling_ratio, pool_mode, aligned)
        return out.to(input.dtype)
    if not fast_kernel_applies(input, rois, pool_mode):
        from mmcv.ops import roi_align as mmcv_roi_align
        return mmcv_roi_align(input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned)
    _check(input, rois)
    return _RoIAlignAvg.apply(input, rois, output_size, float(spatial_scale), int(sampling_ratio), bool(aligned))


@functools.lru_cache(maxsize=None)
def layer_class() -> type:
    """``mmplugin.ops.RoIAlign``: a subclass of ``mmcv.ops.RoIAlign`` (the same constructor, attributes and repr; code
    that checks for mmcv's class, such as mmdeploy's TensorRT rewriter of mmdet's RoI extractor, accepts it) whose
    forward runs :func:`roi_align`. Built on first use, as importing ``mmcv.ops`` loads mmcv's compiled ops."""
    from mmcv.ops import RoIAlign as MmcvRoIAlign

    class RoIAlign(MmcvRoIAlign):
        __doc__ = f"""Drop-in for ``mmcv.ops.RoIAlign`` whose forward runs :func:`{__name__}.roi_align` (the plugin's
        CPU kernel, mmcv's elsewhere). Arguments as mmcv's: output_size, spatial_scale, sampling_ratio (0: adaptive),
        pool_mode ('avg' | 'max'), aligned, use_torchvision."""
        __module__ = __name__

        def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
            """input ``(N, C, H, W)``, rois ``(K, 5)`` -> ``(K, C, out_h, out_w)``."""
            if self.pool_mode not in ('avg', 'max'):
                raise ValueError(f"pool_mode must be 'avg' or 'max', got {self.pool_mode!r}")
            if self.use_torchvision:
                return super().forward(input, rois)
            return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.pool_mode,
                             self.aligned)

    RoIAlign.__qualname__ = 'RoIAlign'
    return RoIAlign


def __getattr__(name: str):
    if name == 'RoIAlign':
        return layer_class()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
