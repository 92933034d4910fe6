"""Relative error between outputs, the one metric of every parity check (tests, ONNX / mmdeploy parity, speed
tables).

Computed in float64, so the metric adds no rounding of its own (float32 would add ~6e-8 relative: comparable to the
tightest bounds the tests assert).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ['rel_error', 'max_rel_error', 'pairwise_rel_error']


def rel_error(a, b: torch.Tensor) -> float:
    """``max|a - b| / max|b|`` of two tensors (or arrays) of one shape, in float64.

    NaN where ``b`` has NaN is a match, NaN anywhere else gives ``inf``; ``+-inf`` at the same places match. A
    zero reference gives 0 for a zero ``a`` and a huge value otherwise (the denominator is clamped to float64's
    smallest normal number).

    Raises:
        ValueError: the shapes differ.
    """
    a, b = torch.as_tensor(a).detach().double(), torch.as_tensor(b).detach().double()
    if a.shape != b.shape:
        raise ValueError(f'output shape {tuple(a.shape)} differs from the reference {tuple(b.shape)}')
    if not torch.equal(a.isnan(), b.isnan()):
        return math.inf
    if a.numel() == 0:
        return 0.0
    a, b = torch.nan_to_num(a), torch.nan_to_num(b)
    return ((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(torch.float64).tiny)).item()


def max_rel_error(ours: Sequence, ref: Sequence[torch.Tensor]) -> float:
    """The worst :func:`rel_error` over paired outputs (e.g. a graph's outputs against eager PyTorch's).

    Raises:
        ValueError: the numbers of outputs or a pair's shapes differ.
    """
    if len(ours) != len(ref):
        raise ValueError(f'{len(ours)} outputs against {len(ref)} reference outputs')
    return max((rel_error(a, b) for a, b in zip(ours, ref)), default=0.0)


def pairwise_rel_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(Na, Nb)`` float64 matrix of :func:`rel_error` between every row of ``a (Na, D)`` and every row of
    ``b (Nb, D)`` (e.g. detected boxes, to match two lists of detections), vectorised."""
    a, b = torch.as_tensor(a).detach().double(), torch.as_tensor(b).detach().double()
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f'expected (Na, D) and (Nb, D) rows, got {tuple(a.shape)} and {tuple(b.shape)}')
    diff = (a[:, None, :] - b[None, :, :]).abs().amax(-1)
    return diff / b.abs().amax(-1).clamp_min(torch.finfo(torch.float64).tiny)[None, :]
