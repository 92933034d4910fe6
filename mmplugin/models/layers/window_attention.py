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
def is_tracing() -> bool:
    """True while torch.compile, torch.export or torch.onnx.export capture a graph (sizes may be symbolic)."""
    return torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


def must_pad(h, w, multiple: int) -> bool:
    """Whether an ``h x w`` map is padded to a multiple of ``multiple`` before use.

    Eager: only when a side is not divisible. While tracing: always (a zero-size pad is free in a graph), so the
    graph holds no size-dependent branch, exports for every size and compiles once for all sizes.
    """
    return is_tracing() or not isinstance(h, int) or not isinstance(w, int) or bool(h % multiple or w % multiple)


def padded_size(n, ws: int):
    """Smallest multiple of ``ws`` that is ``>= n``; plain integer arithmetic, so ``n`` may be a SymInt."""
    return (n + ws - 1) // ws * ws


def window_index(h, w, ws: int, shift: int, device: torch.device):
    """Gather indices and shift-region labels for an ``h x w`` map padded to ``Hp x Wp`` (``nW`` windows).

    Built from rotated ``arange`` vectors, integer arithmetic and gathers only: no reshape of a permuted tensor,
    no slicing that may clamp and no remainder by a size. So ``h`` and ``w`` may be symbolic: under
    torch.compile / export the indices are computed inside the graph from the input's shape without any guard
    on the size, and every op has a plain ONNX form. Eager calls go through the cached :func:`_window_index`.

    Returns:
        fwd: ``(Hp*Wp,)`` long; position ``p`` of the windowed sequence reads flat padded position ``fwd[p]``.
        inv: ``(h*w,)`` long; flat unpadded position ``q`` reads windowed position ``inv[q]``.
        label: ``(nW, ws*ws)`` int32 shift-region label of every windowed position; None if no shift.
    """
    def arange(*args):
        return torch.arange(*args, device=device)

    hp, wp = padded_size(h, ws), padded_size(w, ws)
    nw = wp // ws
    offs = arange(ws)
    win_r = (arange(hp // ws) * ws)[:, None] + offs  # (nh, ws): rolled row of window row a, offset u
    win_c = (arange(nw) * ws)[:, None] + offs  # (nw, ws)
    # the rolled map's row r holds padded row (r + shift) % Hp: a rotated arange
    rows = torch.cat((arange(shift, hp), arange(shift)))[win_r]
    cols = torch.cat((arange(shift, wp), arange(shift)))[win_c]
    fwd = (rows[:, None, :, None] * wp + cols[None, :, None, :]).flatten()  # (nh, nw, ws, ws) window-major
    # padded row i sits at rolled row (i - shift) % Hp = window row r // ws, offset r % ws (i < h only)
    r = torch.cat((arange(hp - shift, hp), arange(hp - shift)))[arange(h)]
    c = torch.cat((arange(wp - shift, wp), arange(wp - shift)))[arange(w)]
    inv = ((r // ws) * (nw * ws * ws) + (r % ws) * ws)[:, None] + ((c // ws) * (ws * ws) + c % ws)[None, :]
    label = None
    if shift > 0:
        def region(n, win):  # 0 | 1 | 2 along a rolled axis: the official slices (0, -ws), (-ws, -shift), (-shift, n)
            i32 = dict(dtype=torch.int32, device=device)  # int32: ONNX Add has no uint8 kernel before opset 14
            return torch.cat((torch.zeros(n - ws, **i32), torch.ones(ws - shift, **i32),
                              torch.full((shift, ), 2, **i32)))[win]
        label = (region(hp, win_r)[:, None, :, None] * 3 + region(wp, win_c)[None, :, None, :]).flatten(2)
        label = label.flatten(0, 1)
    return fwd, inv.flatten(), label


_window_index = lru_cache(maxsize=64)(window_index)  # eager only: keys must be hashable ints


class WindowGeometry:
    """Per-stage description of how an ``(H, W)`` map is windowed; computed once and shared by its blocks.

    Eager: the index tensors come from a cache keyed by the size, so only the ``(nW, N, N)`` shift mask is built
    per stage and forward. While tracing (``h``, ``w`` may be SymInts), the same indices are computed in the graph
    and the map is always padded, so exported / compiled models run at any size with eager's exact arithmetic.
    """

    def __init__(self, h: int, w: int, ws: int, shift: int, device: torch.device):
        self.h, self.w, self.ws, self.shift = h, w, ws, shift
        self.hp, self.wp = padded_size(h, ws), padded_size(w, ws)
        self.num_windows = (self.hp // ws) * (self.wp // ws)
        self.traced = is_tracing() or not isinstance(h, int) or not isinstance(w, int)
        index = window_index if self.traced else _window_index
        self.fwd, self.inv, label = index(h, w, ws, shift, device)
        # (nW, N, N): 0 within a shift region, MASK_VALUE across
        self.mask = None if label is None else (label[:, :, None] != label[:, None, :]).float() * MASK_VALUE

    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, W, C)`` -> ``(B * nW, ws*ws, C)``: pad bottom/right, cyclic shift, cut windows."""
        b, h, w, c = x.shape
        if self.traced or (self.hp, self.wp) != (h, w):
            x = F.pad(x, (0, 0, 0, self.wp - w, 0, self.hp - h))
        x = x.reshape(b, self.hp * self.wp, c).index_select(1, self.fwd)
        return x.view(b * self.num_windows, self.ws * self.ws, c)

    def reverse(self, win: torch.Tensor, b: int) -> torch.Tensor:
        """``(B * nW, ws*ws, C)`` -> ``(B, H, W, C)``: merge windows, undo the shift, crop the padding."""
        c = win.shape[-1]
        return win.reshape(b, self.hp * self.wp, c).index_select(1, self.inv).view(b, self.h, self.w, c)


def relative_position_index(ws: int, device: torch.device, table_ws: int | None = None) -> torch.Tensor:
    """``(ws*ws, ws*ws)`` index into a ``(2T-1)^2`` table (``T = table_ws``, default ``ws``):
    ``(dy + T - 1) * (2T - 1) + (dx + T - 1)``. A window smaller than the table's reads the table's centre, i.e.
    the same offsets.

    Cached in eager mode; built in the graph while tracing, so no tensor created under a fake / tracing mode
    is ever cached (non-strict export runs this code with fake tensors).
    """
    if is_tracing():
        return _relative_position_index(ws, device, table_ws)
    return _cached_relative_position_index(ws, device, table_ws)


def _relative_position_index(ws: int, device: torch.device, table_ws: int | None = None) -> torch.Tensor:
    t = table_ws or ws
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :] + (t - 1)
    return (rel[0] * (2 * t - 1) + rel[1]).to(device)


_cached_relative_position_index = lru_cache(maxsize=64)(_relative_position_index)


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


def _attend(q, k, v, bias: torch.Tensor, b: int, scale: float | None, per_window: bool,
            dropout: float = 0.0) -> torch.Tensor:
    """SDPA over windows. ``bias``: ``(nW, heads, N, N)`` if ``per_window`` (shift mask) else ``(1, heads, N, N)``,
    shared by the ``b`` images of the batch; ``dropout`` on the attention probabilities (training only). The branch
    is on ``per_window`` only (never on a size), so a traced graph serves every batch and window count; for
    ``b == 1`` the expand-reshape is a view."""
    bw, heads, n, d = q.shape
    if per_window and is_tracing():
        bias = bias.repeat(b, 1, 1, 1)  # a copy for every batch size: no view-or-copy decision, no guard on b
    elif per_window:
        bias = bias.unsqueeze(0).expand(b, -1, -1, -1, -1).reshape(bw, heads, n, n)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale,
                                         dropout_p=dropout).transpose(1, 2)
    if torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting():
        # eager CPU/CUDA SDPA kernels return (B*nW, N, heads, d)-contiguous memory, so the reshape below is traced
        # as a view; the ONNX exporter then decomposes SDPA into math ops whose output is heads-major, and that view
        # fails. An explicit copy (an Identity in ONNX) keeps the graph valid for every layout.
        out = out.clone(memory_format=torch.contiguous_format)
    return out.reshape(bw, n, heads * d)


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
        out = self.proj(_attend(q, k, v, bias, b, self.scale, geom.mask is not None,
                                self.attn_drop if self.training else 0.0))
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
        out = self.proj(_attend(q, k, v, self._bias(geom), b, 1.0, geom.mask is not None,
                                self.attn_drop if self.training else 0.0))
        return geom.reverse(self.proj_drop(out), b)
