"""Shifted-window attention shared by Swin V1 and V2.

Feature maps are ``(B, H, W, C)`` (channels last) throughout. Windows follow the official detection code: the
block input is zero-padded at the bottom/right to a multiple of the window, cyclically shifted by
``-shift``, cut into ``ws x ws`` windows; the inverse undoes the shift and crops the padding.

Speed, compared with the usual roll -> partition -> attention -> reverse -> roll -> crop chain:

* the cyclic shift and the window partition are one ``index_select`` with a cached permutation, and the
  reverse + un-shift + crop is another, so each direction copies the map once instead of two or three times;
* the shift mask is built with tensor ops once per stage and forward from cached per-position region labels;
  blocks of a stage share it (``WindowGeometry``), and the cache holds only small index tensors;
* a block's relative position bias is gathered once per forward, added to the mask once, and handed to
  :func:`torch.nn.functional.scaled_dot_product_attention` as a float mask;
* V2's per-head logit scale is folded into the normalised queries, so SDPA runs with ``scale=1``.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

MASK_VALUE = -100.0  # the fill value of every Swin implementation; finite, so safe in fp16/bf16


# ---------------------------------------------------------------------------------------------------- geometry
@lru_cache(maxsize=64)
def _window_index(h: int, w: int, ws: int, shift: int, device: torch.device):
    """Cached gather indices and shift-region labels for an ``h x w`` map padded to ``Hp x Wp``.

    Returns:
        fwd: ``(Hp*Wp,)`` long; position ``p`` of the windowed sequence reads flat padded position ``fwd[p]``.
        inv: ``(h*w,)`` long; flat unpadded position ``q`` reads windowed position ``inv[q]``.
        label: ``(nW, ws*ws)`` uint8 shift-region label of every windowed position; None if no shift. Only these
            small tensors are cached; the ``(nW, N, N)`` mask is built from them once per stage and forward.
    """
    hp, wp = math.ceil(h / ws) * ws, math.ceil(w / ws) * ws
    rows = (torch.arange(hp, device=device) + shift) % hp  # rolled map (i, j) reads padded (i+s, j+s)
    cols = (torch.arange(wp, device=device) + shift) % wp
    src = rows[:, None] * wp + cols[None, :]  # (Hp, Wp) flat source index for each rolled position
    fwd = src.view(hp // ws, ws, wp // ws, ws).permute(0, 2, 1, 3).reshape(-1)
    pos = torch.empty_like(fwd)
    pos[fwd] = torch.arange(fwd.numel(), device=device)  # padded flat position -> windowed position
    inv = pos.view(hp, wp)[:h, :w].reshape(-1)
    label = None
    if shift > 0:
        def region(n):
            idx = torch.arange(n, device=device)
            return (idx >= n - ws).long() + (idx >= n - shift).long()
        label = region(hp)[:, None] * 3 + region(wp)[None, :]
        label = label.view(hp // ws, ws, wp // ws, ws).permute(0, 2, 1, 3).reshape(-1, ws * ws).to(torch.uint8)
    return fwd, inv, label


class WindowGeometry:
    """Per-stage description of how an ``(H, W)`` map is windowed; computed once and shared by its blocks."""

    def __init__(self, h: int, w: int, ws: int, shift: int, device: torch.device):
        self.h, self.w, self.ws, self.shift = h, w, ws, shift
        self.hp, self.wp = math.ceil(h / ws) * ws, math.ceil(w / ws) * ws
        self.fwd, self.inv, label = _window_index(h, w, ws, shift, device)
        # (nW, N, N): 0 within a shift region, MASK_VALUE across
        self.mask = None if label is None else (label[:, :, None] != label[:, None, :]).float() * MASK_VALUE

    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, W, C)`` -> ``(B * nW, ws*ws, C)``: pad bottom/right, cyclic shift, cut windows."""
        b, h, w, c = x.shape
        if (self.hp, self.wp) != (h, w):
            x = F.pad(x, (0, 0, 0, self.wp - w, 0, self.hp - h))
        x = x.reshape(b, self.hp * self.wp, c).index_select(1, self.fwd)
        return x.view(-1, self.ws * self.ws, c)

    def reverse(self, win: torch.Tensor, b: int) -> torch.Tensor:
        """``(B * nW, ws*ws, C)`` -> ``(B, H, W, C)``: merge windows, undo the shift, crop the padding."""
        c = win.shape[-1]
        return win.reshape(b, -1, c).index_select(1, self.inv).view(b, self.h, self.w, c)


@lru_cache(maxsize=64)
def relative_position_index(ws: int, device: torch.device, table_ws: int | None = None) -> torch.Tensor:
    """``(ws*ws, ws*ws)`` index into a ``(2T-1)^2`` table (``T = table_ws``, default ``ws``):
    ``(dy + T - 1) * (2T - 1) + (dx + T - 1)``. A window smaller than the table's reads the table's centre, i.e.
    the same offsets."""
    t = table_ws or ws
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :] + (t - 1)
    return (rel[0] * (2 * t - 1) + rel[1]).to(device)


def log_spaced_coords(ws: int, pretrained_ws: int) -> torch.Tensor:
    """V2 continuous position bias input: ``(2ws-1, 2ws-1, 2)`` log-spaced relative coordinates.

    Offsets are normalised by ``pretrained_ws - 1`` (so a fine-tuned larger window extrapolates the pretrained
    range), scaled to [-8, 8] and mapped by ``sign(t) * log2(1 + |t|) / log2(8)``.
    """
    r = torch.arange(-(ws - 1), ws, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(r, r, indexing='ij'), dim=-1)
    table = table / max(pretrained_ws - 1, 1) * 8
    return torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)


# ---------------------------------------------------------------------------------------------------- attention
def _split_heads(qkv: torch.Tensor, heads: int):
    bw, n, c3 = qkv.shape
    qkv = qkv.view(bw, n, 3, heads, c3 // (3 * heads)).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]  # (B*nW, heads, N, d) each


def _attend(q, k, v, bias: torch.Tensor, b: int, scale: float | None, dropout: float = 0.0) -> torch.Tensor:
    """SDPA over windows. ``bias``: ``(nW or 1, heads, N, N)`` shared by the ``b`` images of the batch;
    ``dropout`` on the attention probabilities (training only)."""
    bw, heads, n, d = q.shape
    if b > 1 and bias.shape[0] > 1:
        bias = bias.unsqueeze(0).expand(b, -1, -1, -1, -1).reshape(bw, heads, n, n)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale, dropout_p=dropout)
    return out.transpose(1, 2).reshape(bw, n, heads * d)


class WindowAttention(nn.Module):
    """Swin V1 window attention: ``softmax(q k^T / sqrt(d) + B_rel + mask) v`` per window.

    Args:
        dim (int): channels C. num_heads (int): heads. window_size (int): ws.
        qkv_bias (bool): bias in the qkv projection. Defaults to True.
        qk_scale (float | None): attention scale; None means ``head_dim ** -0.5`` (mmdet / mmseg option).
        attn_drop (float): dropout on the attention probabilities. proj_drop (float): dropout after ``proj``.

    Parameters keep the official names (``qkv``, ``proj``, ``relative_position_bias_table`` of shape
    ``((2ws-1)^2, heads)``); the index is a cached, non-persistent derived tensor.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.num_heads, self.window_size = num_heads, window_size
        self.scale = qk_scale or (dim // num_heads)**-0.5
        self.attn_drop = attn_drop
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1)**2, num_heads))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def position_bias(self, ws: int | None = None) -> torch.Tensor:
        """``(heads, N, N)`` relative position bias of a ``ws`` window (default: the configured one)."""
        ws = ws or self.window_size
        idx = relative_position_index(ws, self.relative_position_bias_table.device, self.window_size)
        return self.relative_position_bias_table[idx.view(-1)].view(ws * ws, ws * ws, -1).permute(2, 0, 1)

    def forward(self, x: torch.Tensor, geom: WindowGeometry) -> torch.Tensor:
        """x: ``(B, H, W, C)`` block input (already normalised for V1) -> ``(B, H, W, C)``."""
        b = x.shape[0]
        win = geom.partition(x)
        q, k, v = _split_heads(self.qkv(win), self.num_heads)
        bias = self._bias(geom)
        out = self.proj(_attend(q, k, v, bias, b, self.scale, self.attn_drop if self.training else 0.0))
        return geom.reverse(self.proj_drop(out), b)

    def _bias(self, geom: WindowGeometry) -> torch.Tensor:
        bias = self.position_bias(geom.ws).unsqueeze(0)  # (1, heads, N, N)
        return bias if geom.mask is None else bias + geom.mask.unsqueeze(1)


class WindowAttentionV2(WindowAttention):
    """Swin V2 window attention: scaled cosine attention with log-spaced continuous position bias.

    ``attn = cos(q, k) * exp(min(logit_scale, log 100)) + 16 * sigmoid(cpb_mlp(coords))[index] + mask``.
    q and v have separate biases (k has none). Parameters keep the official names.

    Args:
        pretrained_window_size (int): window the weights were trained with; coordinates are normalised by it.
            0 means the window actually used (``window_size``, or the smaller window of a small map).
        attn_drop (float): dropout on the attention probabilities. proj_drop (float): dropout after ``proj``.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool = True,
                 pretrained_window_size: int = 0, attn_drop: float = 0.0, proj_drop: float = 0.0):
        nn.Module.__init__(self)
        self.num_heads, self.window_size = num_heads, window_size
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)
        self.pretrained_window_size_arg = pretrained_window_size
        self.pretrained_window_size = pretrained_window_size or window_size
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(num_heads, 1, 1)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512, bias=True), nn.ReLU(inplace=True),
                                     nn.Linear(512, num_heads, bias=False))
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.v_bias = None
        self.proj = nn.Linear(dim, dim)
        self.register_buffer('relative_coords_table',
                             log_spaced_coords(window_size, self.pretrained_window_size), persistent=False)

    def position_bias(self, ws: int | None = None) -> torch.Tensor:
        ws = ws or self.window_size
        if ws == self.window_size:
            coords = self.relative_coords_table
        else:  # a smaller window on a small map (pad_small_map=False), as the official code builds it
            coords = log_spaced_coords(ws, self.pretrained_window_size_arg or ws).to(self.relative_coords_table)
        table = self.cpb_mlp(coords).view(-1, self.num_heads)
        idx = relative_position_index(ws, table.device)
        return 16 * torch.sigmoid(table[idx.view(-1)].view(ws * ws, ws * ws, -1).permute(2, 0, 1))

    def forward(self, x: torch.Tensor, geom: WindowGeometry) -> torch.Tensor:
        b = x.shape[0]
        win = geom.partition(x)
        bias = None
        if self.q_bias is not None:
            bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
        q, k, v = _split_heads(F.linear(win, self.qkv.weight, bias), self.num_heads)
        scale = torch.exp(torch.clamp(self.logit_scale, max=math.log(100.0)))  # (heads, 1, 1), fp32-safe
        q = F.normalize(q, dim=-1) * scale.to(q.dtype)
        k = F.normalize(k, dim=-1)
        out = self.proj(_attend(q, k, v, self._bias(geom), b, 1.0, self.attn_drop if self.training else 0.0))
        return geom.reverse(self.proj_drop(out), b)
