"""SwiftFormer's efficient additive attention (paper Eq. 4-6): queries and keys projected, queries pooled into
one global query by learned token scores, broadcast against the keys; linear in the token count.

* :func:`l2_normalize` / :class:`L2Norm`: the L2 normalisation of tokens and scores, written with delegate-friendly
  ops (int8 keeps it a module of its own, :mod:`mmplugin.quantization.pt2e`);
* :class:`EfficientAdditiveAttention`: the attention on ``(B, N, C)`` tokens, with its deploy-time folding.
"""
from __future__ import annotations

import torch
from torch import nn

from mmplugin.models.layers.fusion import linear, linear_add
from mmplugin.models.layers.precision import NARROW_RANGE_DTYPES, autocast_dtype

__all__ = ['l2_normalize', 'L2Norm', 'EfficientAdditiveAttention']


def l2_normalize(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    """``F.normalize(x, dim=dim, eps=eps)`` of tokens ``x (B, N, C)``, i.e. ``x / max(||x||_2, eps)`` along ``dim``:
    ``-1`` normalises each token over its ``C`` channels, ``1`` the ``N`` token scores of shape ``(B, N, 1)``.

    Written with ops every mobile delegate has, where ``F.normalize`` lowers to ``pow(0.5)``, ``sum`` and
    ``expand_copy`` and splits the exported graph into many segments: over channels
    ``x * rsqrt(max(C * mean(x * x), eps^2))`` with the mean over the last two dims of a ``(B, N, C, 1)`` view
    (XNNPACK lowers it to global average pooling; it has no ``sum``); over tokens the squared norm is
    ``bmm(x^T, x)``. No size but ``C`` is read, so a dynamic batch exports without shape ops. Same value up to
    rounding (float64: ~1e-16 relative). fp16 tokens are normalised in fp32 and cast back (as
    ``F.normalize`` runs under GPU autocast, :mod:`~mmplugin.models.layers.precision`), the token scores' ``bmm``
    with autocast off (which would otherwise cast it back to fp16, where 300 scores of 20 overflow to a zero norm).
    """
    if x.dim() != 3 or dim not in (-1, 2, 1) or (dim == 1 and x.shape[-1] != 1):
        raise ValueError('l2_normalize takes tokens (B, N, C) with dim=-1, or token scores (B, N, 1) with dim=1; '
                         f'got {tuple(x.shape)}, dim={dim}')
    low = x.dtype in NARROW_RANGE_DTYPES  # fp16's range: squares overflow past 256 and eps^2 is 0: in fp32
    xf = x.float() if low else x
    if dim == 1 and low and autocast_dtype(x.device.type) is not None:
        with torch.autocast(x.device.type, enabled=False):  # autocast would run the bmm in fp16 again
            sq = torch.bmm(xf.transpose(1, 2), xf)  # (B, 1, 1)
    elif dim == 1:
        sq = torch.bmm(xf.transpose(1, 2), xf)
    else:
        sq = (xf * xf).unsqueeze(-1).mean((-2, -1), keepdim=True).flatten(-2) * x.shape[-1]  # (B, N, 1)
    y = xf * torch.rsqrt(torch.clamp_min(sq, eps * eps))
    return y.to(x.dtype) if low else y


class L2Norm(nn.Module):
    """:func:`l2_normalize` along ``dim`` as a module: no parameters (checkpoint keys unchanged), and a module type
    that int8 quantisation can keep float by name (its int8 grid is coarse against unit-norm tokens, docs/int8.md).
    """

    def __init__(self, dim: int = -1, eps: float = 1e-12):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x, self.dim, self.eps)

    def extra_repr(self) -> str:
        return f'dim={self.dim}'


class EfficientAdditiveAttention(nn.Module):
    """Efficient additive attention on tokens ``x`` of shape ``(B, N, C)`` (paper eq. 4-6).

    ``q, k = l2norm(Wq x), l2norm(Wk x)``; token scores ``a = q w_g / sqrt(C)``; weights ``A = l2norm_N(a)``
    (``token_weighting='l2norm'``, the July-2023 official weights) or all ones (``'legacy_softmax'``: the first
    release took a softmax over a size-1 axis); global query ``G = sum_n A_n q_n`` of shape ``(B, 1, C)``;
    output ``final(proj(G * k) + q)``. ``out_scale`` (the block's layer scale, or None) is folded into ``final``.
    """

    def __init__(self, dim: int, token_weighting: str = 'l2norm'):
        super().__init__()
        if token_weighting not in ('l2norm', 'legacy_softmax'):
            raise ValueError(f"token_weighting must be 'l2norm' or 'legacy_softmax', got {token_weighting!r}")
        self.token_weighting = token_weighting
        self.to_query = nn.Linear(dim, dim)
        self.to_key = nn.Linear(dim, dim)
        self.w_g = nn.Parameter(torch.randn(dim, 1))
        self.scale = dim**-0.5
        self.proj = nn.Linear(dim, dim)
        self.final = nn.Linear(dim, dim)
        self.q_norm, self.k_norm, self.token_norm = L2Norm(-1), L2Norm(-1), L2Norm(1)

    def token_scores(self, q: torch.Tensor) -> torch.Tensor:
        """``q (B, N, C) -> q w_g / sqrt(C)`` of shape ``(B, N, 1)``."""
        return (q @ self.w_g) * self.scale

    def forward(self, x: torch.Tensor, out_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, N, C) -> (B, N, C)``. The four linears run through :mod:`mmplugin.models.layers.fusion`: at
        inference on oneDNN (bias and the ``+ q`` residual added in the GEMM's output tile, weights prepacked where
        frozen), in CPU fp32 training on its training GEMMs, and as module calls in traced / exported / compiled
        graphs (``final`` with a layer scale: ``F.linear`` on the scaled weights)."""
        q = self.q_norm(linear(x, self.to_query))  # (B, N, C); two GEMMs on constant weights (exports take those)
        k = self.k_norm(linear(x, self.to_key))  # (B, N, C)
        if self.token_weighting == 'l2norm':
            a = self.token_norm(self.token_scores(q))  # (B, N, 1), normalised over the N tokens
            g = torch.bmm(a.transpose(1, 2), q)  # (B, 1, C); bmm, not @: no expand in the exported graph
        else:
            g = q.sum(dim=1, keepdim=True)
        out = linear_add(g * k, self.proj, q)  # proj(G * k) + q
        if out_scale is None:
            return linear(out, self.final)
        s = out_scale.reshape(-1)
        return linear(out, self.final, self.final.weight * s[:, None], self.final.bias * s)
