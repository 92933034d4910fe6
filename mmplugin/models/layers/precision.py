"""Reduced precision (fp16 / bf16) on any device: which dtype autocast computes in, and the few reductions that
must run in fp32 when their inputs are half precision.

fp16 has 5 exponent bits: its largest value is 65504 and its smallest normal 6.1e-5, so a sum of squares over a
few hundred values of magnitude ~20 overflows, and the usual ``1e-12`` epsilon of an L2 normalisation rounds to
0 (a zero vector then normalises to 0 / 0 = NaN). The papers' code runs these reductions in fp32 under GPU
autocast (CUDA autocast lists ``norm`` / ``normalize`` among its fp32 ops); CPU autocast and a ``.half()`` model
do not, so the plugin asks for fp32 explicitly there and casts the normalised result back.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ['REDUCED_DTYPES', 'NARROW_RANGE_DTYPES', 'autocast_dtype', 'fp32_normalize']

REDUCED_DTYPES = (torch.float16, torch.bfloat16)
# dtypes whose exponent range is narrower than fp32's: their reductions run in fp32. bf16 has fp32's range (its
# 1e-12 epsilon and sums of squares are representable) and keeps its own, faster path: normalising Swin V2-T's
# queries and keys in fp32 under bf16 autocast cost 16% of the forward (800x1216, Xeon family 6 model 167).
NARROW_RANGE_DTYPES = (torch.float16, )


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes matrix products in on ``device_type``, or None when autocast is off there.

    Device types without autocast (``meta``, where shapes are planned without memory) are "off", instead of the
    RuntimeError ``torch.is_autocast_enabled`` raises for them.
    """
    if device_type not in _AUTOCAST_DEVICES and not torch.amp.is_autocast_available(device_type):
        return None
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


_AUTOCAST_DEVICES = frozenset(('cpu', 'cuda', 'xpu', 'mps', 'hpu', 'mtia', 'xla', 'privateuseone'))


def fp32_normalize(x: torch.Tensor, dim: int = -1, scale: torch.Tensor | float | None = None,
                   eps: float = 1e-12) -> torch.Tensor:
    """``F.normalize(x, dim=dim, eps=eps) * scale`` in ``x``'s dtype, computed in fp32 when ``x`` is fp16.

    ``scale`` (broadcastable, e.g. Swin V2's per-head logit scale ``(heads, 1, 1)``) is applied before the cast
    back, so the product is rounded once. Other dtypes take ``F.normalize`` as it is (bit-identical to the
    unscaled formulation when ``scale`` is None).
    """
    if x.dtype in NARROW_RANGE_DTYPES:
        y = F.normalize(x.float(), dim=dim, eps=eps)
        if scale is not None:
            y = y * (scale.float() if isinstance(scale, torch.Tensor) else scale)
        return y.to(x.dtype)
    y = F.normalize(x, dim=dim, eps=eps)
    if scale is not None:
        y = y * (scale.to(x.dtype) if isinstance(scale, torch.Tensor) else scale)
    return y
