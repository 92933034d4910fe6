"""The exact (erf) GELU's gradient on CPUs, with GELU itself from the same pass: ``gelu.c``, built on first use for
the vector ISA torch dispatches to (:mod:`mmplugin.ops.build`).

Why: Swin's fp32 training step (:mod:`mmplugin.models.layers.recompute`) keeps only the MLP's hidden map ``h`` for
the backward and needs both ``GELU(h)`` (fc2's weight gradient) and ``GELU'(h)`` there. PyTorch computes them in two
passes (``F.gelu`` and ``gelu_backward``), each reading ``h`` and computing erf; the kernel reads ``h`` and the
incoming gradient once and writes both. Swin-T's stage-1 hidden map at 512x768, batch 2 (2 x 128 x 192 x 384 fp32),
2 threads of an Intel Xeon family 6 model 167: 12.6 ms against 19.7 ms for the two PyTorch ops, interleaved, median
of 15.

Accuracy: erf from two polynomial fits (``gelu.c``), within 4 fp32 ulps of ``|g|`` for the gradient and 3 of
``|h|`` for GELU against float64 (PyTorch's own kernels: about 4.5 and 2); bf16 computes in fp32 and rounds once.
Non-finite values land where PyTorch's kernels put them. tests/engine/test_gelu_kernel.py checks both against the
float64 formulas on every ISA build.
"""
from __future__ import annotations

import ctypes

import torch

from mmplugin.ops.build import kernel_library
from mmplugin.ops.eligible import eager_context, plain_cpu

__all__ = ['available', 'applies', 'gelu_grad']

_SUFFIX = {torch.float32: 'f32', torch.bfloat16: 'bf16'}
_ARGS = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int]


def _kernels() -> ctypes.CDLL | None:
    """The library for the current ISA, or None where it cannot be built (warned once per ISA)."""
    return kernel_library('gelu', {f'mmplugin_gelu_grad_{s}': _ARGS for s in _SUFFIX.values()},
                          "GELU's gradient runs in PyTorch")


def available() -> bool:
    """Whether the kernel for the current ISA is built (building it on first call; warned once where it cannot)."""
    return _kernels() is not None


def applies(h: torch.Tensor) -> bool:
    """Whether :func:`gelu_grad` serves the hidden map ``h`` with a contiguous gradient of its shape and dtype (and
    no output, or the gradient itself as the output): eager, a plain contiguous fp32 / bf16 CPU tensor, a built
    kernel."""
    return (eager_context() and plain_cpu(h) and h.device.type == 'cpu' and h.dtype in _SUFFIX and h.is_contiguous()
            and available())


def gelu_grad(h: torch.Tensor, grad: torch.Tensor, act: bool = False,
              out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``grad * GELU'(h)`` (exact erf GELU, as ``torch.ops.aten.gelu_backward``) and, with ``act``, ``GELU(h)``
    (as ``F.gelu``), for ``h`` and ``grad`` of one shape and dtype (fp32 or bf16): returns ``(d_h, GELU(h) or
    None)``. ``out`` receives ``d_h`` (it may be ``grad`` itself: elementwise, in place is exact); otherwise a new
    tensor. No autograd. Returns None where the kernel does not apply (not eager, not plain contiguous CPU tensors,
    another dtype or shape, no kernel built), and the caller runs PyTorch's ops."""
    if not (applies(h) and plain_cpu(grad) and plain_cpu(out)
            and grad.dtype == h.dtype and grad.shape == h.shape and grad.is_contiguous()
            and (out is None or (out.dtype == h.dtype and out.shape == h.shape and out.is_contiguous()
                                 and not _overlap(out, h)
                                 and (out.data_ptr() == grad.data_ptr() or not _overlap(out, grad))))):
        return None
    lib = _kernels()
    d_h = torch.empty_like(h) if out is None else out
    a = torch.empty_like(h) if act else None
    getattr(lib, f'mmplugin_gelu_grad_{_SUFFIX[h.dtype]}')(
        h.data_ptr(), grad.data_ptr(), d_h.data_ptr(), None if a is None else a.data_ptr(), h.numel(),
        torch.get_num_threads())
    return d_h, a


def _overlap(out: torch.Tensor, *others: torch.Tensor) -> bool:
    """``out``'s memory overlaps one of ``others``' (other than being the very same elements)."""
    lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
    return any(t.data_ptr() < hi and lo < t.data_ptr() + t.numel() * t.element_size() for t in others)
