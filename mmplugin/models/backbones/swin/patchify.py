"""Non-overlapping patch embedding (a convolution whose kernel equals its stride), safe under reduced precision.

``Conv2d(C, D, kernel_size=p, stride=p)`` on a map whose sides are multiples of ``p`` is exactly a linear map
applied to every ``p x p`` patch: split the channels-last ``(B, H, W, C)`` memory of the input into ``(B, H/p, W/p,
p*p*C)`` patches (row, column, channel; a copy of runs of ``p*C`` values, after a channels-last copy of an NCHW input)
and multiply by the weight permuted to ``(D, p, p, C)``. The products and sums are the convolution's (only their
order may differ: float rounding), and each output token reads its own patch only.

Why not always the convolution: oneDNN's native-bf16 convolution for 3 input channels writes NaN into the
output column next to a +/-Inf input pixel on AVX512-BF16 CPUs (channels-last; the correct +/-Inf stays at its
own position; ``docs/cpu_kernels.md`` has the minimal reproduction and the kernels affected). Swin's first layer
sees raw pixels, so one Inf pixel would poison a whole extra attention window. The GEMM form has no
neighbourhood to leak into. In fp32 (no kernel leaks) the channels-last convolution stays: it is the faster of
the two there (the permuted copy costs about as much as the product; see ``docs/cpu_kernels.md``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmplugin.models.layers.precision import autocast_dtype

__all__ = ['patchify_linear', 'patch_embed']


def patchify_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``conv2d(x, weight, bias, stride=p).permute(0, 2, 3, 1)`` computed as one matrix product over patches.

    Args:
        x: ``(B, C, H, W)`` with ``H`` and ``W`` multiples of ``p`` (pad first).
        weight: ``(D, C, p, p)`` convolution weight (square kernel, stride ``p``).
        bias: ``(D,)`` or None.

    Returns:
        ``(B, H/p, W/p, D)`` tokens.
    """
    d, c, p, q = weight.shape
    b, cx, h, w = x.shape
    if p != q or cx != c or h % p or w % p:
        raise ValueError(f'patchify_linear: need a square kernel over {c} channels and a map divisible by it; got '
                         f'weight {tuple(weight.shape)} and input {tuple(x.shape)}')
    # patches as (row, column, channel) runs: in channels-last memory each of a patch's p rows is p * C contiguous
    # values, so the patches are copied in runs of p * C (from NCHW planes: runs of p, 2-3x the time: 3.1 against
    # 1.0 ms for a bf16 800x1216 image, 2 threads, Intel Xeon family 6 model 167), and the weight permuted to match
    rows = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)  # (B, H, W, C), a view of that memory
    patches = rows.reshape(b, h // p, p, w // p, p * c).transpose(2, 3).reshape(b, h // p, w // p, p * p * c)
    return F.linear(patches, weight.permute(0, 2, 3, 1).reshape(d, p * p * c), bias)


def patch_embed(x: torch.Tensor, proj: nn.Conv2d) -> torch.Tensor:
    """``proj(x)`` as ``(B, H/p, W/p, D)`` tokens; ``proj`` has kernel = stride = ``p``, ``x`` is ``(B, C, H, W)``
    with sides divisible by ``p``.

    fp32 / fp64 without autocast: the channels-last convolution. Under autocast or for half-precision inputs: the
    patch GEMM, with the input cast to the compute dtype before the permuted copy (half the bytes to move).
    """
    autocast = autocast_dtype(x.device.type)
    if autocast is None and x.dtype in (torch.float32, torch.float64):
        return proj(x.contiguous(memory_format=torch.channels_last)).permute(0, 2, 3, 1)
    if autocast is not None:
        x = x.to(autocast)
    return patchify_linear(x, proj.weight, proj.bias)
