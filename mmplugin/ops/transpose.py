"""Batched matrix transpose of 2- and 4-byte elements on CPUs: ``transpose.c``, built on first use
(:mod:`mmplugin.ops.build`), split over ``torch.get_num_threads()`` OpenMP threads.

Why: the backbones compute in ``(B, H*W, C)`` memory and return ``(B, C, H*W)`` maps (and take their gradients back
the other way in training); ATen copies a transposed matrix on one thread, at a fraction of what memory allows
(``transpose.c`` has the figures). :mod:`mmplugin.models.layers.layout` uses it; the values are the bits of the
source, so the result equals ATen's copy exactly (tests/engine/test_transpose.py).
"""
from __future__ import annotations

import ctypes

import torch

from mmplugin.ops.build import kernel_library
from mmplugin.ops.eligible import eager_context, plain_cpu

__all__ = ['available', 'serves', 'transpose_into']

_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
_SUFFIX = {4: 'b32', 2: 'b16'}  # element size in bytes -> the kernel copying such bits


def _kernels() -> ctypes.CDLL | None:
    return kernel_library('transpose', {f'mmplugin_transpose_{s}': _ARGS for s in _SUFFIX.values()},
                          'feature-map transposes run in ATen')


def available() -> bool:
    """Whether the kernel is built (building it on first call; warned once where it cannot)."""
    return _kernels() is not None


def serves(t: torch.Tensor) -> bool:
    """Whether the kernel copies tensors like ``t``: eager, a plain CPU tensor of 2- or 4-byte real elements (fp32,
    bf16, fp16), and a built kernel."""
    return (eager_context() and plain_cpu(t) and t.device.type == 'cpu' and t.element_size() in _SUFFIX
            and not t.is_complex() and not (t.is_conj() or t.is_neg()) and available())


def transpose_into(src: torch.Tensor, out: torch.Tensor, batch: int, rows: int, cols: int) -> bool:
    """Copy the contiguous memory of ``src``, read as ``(batch, rows, cols)``, transposed into the contiguous memory of
    ``out``, read as ``(batch, cols, rows)``. Returns False, copying nothing, where the kernel does not serve them:
    outside eager execution, not plain CPU tensors, another dtype than ``out``'s, elements of other than 2 or 4
    bytes (fp32, bf16, fp16), non-contiguous memory, or no kernel (the caller then copies with ATen).

    Raises:
        ValueError: where ``batch * rows * cols`` is not the number of elements of both tensors.
    """
    if not (serves(src) and plain_cpu(out) and out.device.type == 'cpu' and src.dtype == out.dtype
            and src.is_contiguous() and out.is_contiguous()):
        return False
    if not (src.numel() == out.numel() == batch * rows * cols):
        raise ValueError(f'transpose: {batch} x {rows} x {cols} for tensors of {src.numel()} and {out.numel()} '
                         'elements')
    fn = getattr(_kernels(), f'mmplugin_transpose_{_SUFFIX[src.element_size()]}')
    fn(src.data_ptr(), out.data_ptr(), batch, rows, cols, torch.get_num_threads())
    return True
