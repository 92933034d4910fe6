"""LayerNorm of a bf16 map with fp32 affine parameters (PyTorch's mixed-type LayerNorm), forward and backward, on
CPUs: ``layer_norm.c``, built on first use for the vector ISA torch dispatches to (:mod:`mmplugin.ops.build`).

Why: a bf16 Swin under CPU autocast normalises its bf16 residual stream twice per block, and PyTorch's CPU kernels for
this case run at a fraction of what memory allows (``layer_norm.c`` has the figures). The results are PyTorch's
formulas computed in fp32 and rounded once to bf16, up to the fp32 summation order: tests/engine/test_layer_norm.py
checks them against float64 on every ISA build. :mod:`mmplugin.models.layers.low_precision_norm` uses them, in
training and at inference.

Also ``residual + LayerNorm(x)`` in one pass for inference, fp32 or bf16 (:func:`layer_norm_add`): Swin V2's
post-norm blocks add a LayerNorm's output to the residual stream twice per block, a separate pass over the map each
time: the bf16 Swin V2-T forward 6% faster, fp32 level (figures in ``layer_norm.c``).
"""
from __future__ import annotations

import ctypes

import torch

from mmplugin.ops.build import kernel_library
from mmplugin.ops.eligible import eager_context, plain_cpu

__all__ = ['available', 'applies', 'layer_norm_bf16', 'layer_norm_grad_bf16', 'add_applies', 'layer_norm_add']

_P, _I = ctypes.c_void_p, ctypes.c_int64
_FWD = [_P, _P, _P, ctypes.c_float, _I, _I, _P, _P, _P, ctypes.c_int]
_BWD = [_P, _P, _P, _P, _P, _I, _I, _P, _P, _P, ctypes.c_int]


_ADD = [_P, _P, _P, ctypes.c_float, _I, _I, _P, _P, ctypes.c_int]
_ADD_SUFFIX = {torch.float32: 'f32', torch.bfloat16: 'bf16'}


def _kernels() -> ctypes.CDLL | None:
    return kernel_library('layer_norm', {'mmplugin_layer_norm_bf16': _FWD, 'mmplugin_layer_norm_grad_bf16': _BWD,
                                         'mmplugin_layer_norm_add_bf16': _ADD, 'mmplugin_layer_norm_add_f32': _ADD},
                          'LayerNorm (bf16, and the fused residual add) runs in PyTorch')


def available() -> bool:
    """Whether the kernel for the current ISA is built (building it on first call; warned once where it cannot)."""
    return _kernels() is not None


def _serves(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """The conditions every entry shares: eager, a plain contiguous non-empty CPU ``x``, fp32 contiguous ``weight``
    and ``bias`` of its last dimension's size, and a built kernel."""
    return (eager_context() and plain_cpu(x) and x.device.type == 'cpu'
            and x.dim() >= 1 and x.numel() > 0 and x.is_contiguous()
            and all(t is not None and plain_cpu(t) and t.device.type == 'cpu' and t.dtype == torch.float32
                    and t.shape == x.shape[-1:] and t.is_contiguous() for t in (weight, bias))
            and available())


def applies(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether :func:`layer_norm_bf16` serves ``x`` with these affine parameters: eager, a plain contiguous non-empty
    bf16 CPU ``x``, fp32 contiguous ``weight`` and ``bias`` of its last dimension's size, and a built kernel."""
    return x.dtype == torch.bfloat16 and _serves(x, weight, bias)


def layer_norm_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                    stats: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``torch.native_layer_norm(x, x.shape[-1:], weight, bias, eps)`` for ``(..., C)`` bf16 ``x`` where
    :func:`applies`: ``(y, mean, rstd)``, ``y`` bf16 of ``x``'s shape, the row statistics fp32 of shape
    ``x.shape[:-1]`` (None with ``stats=False``: inference keeps none). No autograd."""
    c = x.shape[-1]
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[:-1], dtype=torch.float32) if stats else None
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32) if stats else None
    failed = _kernels().mmplugin_layer_norm_bf16(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), float(eps),
                                                 x.numel() // c, c, y.data_ptr(), _ptr(mean), _ptr(rstd),
                                                 torch.get_num_threads())
    if failed:
        raise MemoryError('LayerNorm: out of memory for the per-thread buffers')
    return y, mean, rstd


def add_applies(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                residual: torch.Tensor) -> bool:
    """Whether :func:`layer_norm_add` serves ``residual + LayerNorm(x)``: eager, plain contiguous non-empty fp32 or
    bf16 CPU ``x`` and ``residual`` of one shape and dtype, fp32 contiguous ``weight`` and ``bias`` of the last
    dimension's size, and a built kernel."""
    return (_serves(x, weight, bias) and x.dtype in _ADD_SUFFIX and residual.dtype == x.dtype
            and residual.shape == x.shape and plain_cpu(residual) and residual.device.type == 'cpu'
            and residual.is_contiguous())


def layer_norm_add(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                   residual: torch.Tensor) -> torch.Tensor:
    """``residual + F.layer_norm(x, x.shape[-1:], weight, bias, eps)`` where :func:`add_applies`, in one pass: the
    LayerNorm and the sum in fp32, rounded once to ``x``'s dtype (the two ops round the LayerNorm's output first, so
    bf16 results may differ by that rounding). A new tensor; no autograd."""
    c = x.shape[-1]
    y = torch.empty_like(x)
    fn = getattr(_kernels(), f'mmplugin_layer_norm_add_{_ADD_SUFFIX[x.dtype]}')
    if fn(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), float(eps), x.numel() // c, c, residual.data_ptr(),
          y.data_ptr(), torch.get_num_threads()):
        raise MemoryError('LayerNorm: out of memory for the per-thread buffers')
    return y


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def layer_norm_grad_bf16(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                         weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients ``(dx, dweight, dbias)`` (bf16, fp32, fp32) of :func:`layer_norm_bf16` for the output gradient
    ``dy`` (rounded to bf16 if it is not, made contiguous), from the forward's ``x``, ``mean``, ``rstd``. No
    autograd."""
    c = x.shape[-1]
    dy = dy.to(torch.bfloat16).contiguous()
    dx, dw, db = torch.empty_like(x), torch.empty(c, dtype=torch.float32), torch.empty(c, dtype=torch.float32)
    failed = _kernels().mmplugin_layer_norm_grad_bf16(
        dy.data_ptr(), x.data_ptr(), mean.data_ptr(), rstd.data_ptr(), weight.data_ptr(), x.numel() // c, c,
        dx.data_ptr(), dw.data_ptr(), db.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError('LayerNorm gradient: out of memory for the per-thread sums')
    return dx, dw, db
