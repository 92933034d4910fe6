"""Shifted-window attention of Swin V1 and V2: one forward (partition -> project q, k, v -> attend -> reverse ->
project; q, k, v projected before the partition where padding is a large share) in :class:`WindowAttentionBase`, with
V1 (:class:`WindowAttention`) and V2 (:class:`WindowAttentionV2`) as siblings that supply the query / key / value
projection with its scale, and the relative position bias.

Feature maps are ``(B, H, W, C)`` (channels last) throughout; the window geometry (padding, cyclic shift, partition
and its inverse) is :mod:`.windows`.

Speed, compared with the usual roll -> partition -> attention -> reverse -> roll -> crop chain:

* the cyclic shift and the window partition are one ``index_select`` with a cached permutation, and the
  reverse + un-shift + crop is another, so each direction copies the map once instead of two or three times;
* the shift mask is built with tensor ops once per stage and forward from cached per-position region labels;
  blocks of a stage share it (``WindowGeometry``), and the cache holds only small index tensors;
* CPU inference runs the attention in one fused kernel per window (:mod:`mmplugin.ops.window_attention`: scores,
  position bias + shift mask in fp32, softmax and the value products without the scores leaving the cache), and CPU
  training (fp32, bf16 autocast) in the same kernel with a backward that recomputes each window in cache, both on
  the map's real tokens (no partition or reverse);
* elsewhere a block's relative position bias is gathered once per forward, added to the mask once, and handed to
  :func:`torch.nn.functional.scaled_dot_product_attention` as a float mask;
* V2's per-head logit scale is folded into the normalised queries, so SDPA runs with ``scale=1``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mmplugin.models.backbones.swin.position import coordinate_window, log_spaced_coords, relative_position_index
from mmplugin.models.backbones.swin.windows import (
    MASK_VALUE,
    WindowGeometry,
    is_tracing,
    must_pad,
    padded_size,
    window_index,
)
from mmplugin.models.layers.fusion import linear, linear_add
from mmplugin.models.layers.precision import fp32_normalize
from mmplugin.models.layers.recompute import (
    kernel_context,
    map_attention_dtype,
    map_window_softmax_attention,
    window_softmax,
    window_softmax_attention,
)
from mmplugin.ops.window_attention import available as kernel_available
from mmplugin.ops.window_attention import map_window_attention, window_attention

__all__ = [
    'WindowAttentionBase', 'WindowAttention', 'WindowAttentionV2', 'WindowGeometry', 'coordinate_window',
    'log_spaced_coords', 'relative_position_index', 'MASK_VALUE', 'is_tracing', 'must_pad', 'padded_size',
    'window_index'
]


# ---------------------------------------------------------------------------------------------------- attention
def _split_heads(qkv: torch.Tensor, heads: int):
    """``(B*nW, N, 3C)`` projections -> their ``(3, B*nW, heads, N, d)`` view and its slices q, k, v."""
    bw, n, c3 = qkv.shape
    packed = qkv.view(bw, n, 3, heads, c3 // (3 * heads)).permute(2, 0, 3, 1, 4)
    if torch.is_grad_enabled() and not is_tracing() and not torch.compiler.is_exporting():
        # one gradient node that stacks the three gradients, where indexing zero-fills a full (3, ...) buffer for
        # each of q, k and v and adds the three
        return packed, *packed.unbind(0)
    return packed, packed[0], packed[1], packed[2]  # (B*nW, heads, N, d) each


def _attend(q, k, v, pos: torch.Tensor, mask: torch.Tensor | None, b: int, scale: float | None,
            dropout: float = 0.0, cosine: torch.Tensor | None = None,
            packed: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA over windows. ``pos``: the ``(1, heads, N, N)`` position bias; ``mask``: the ``(nW, N, N)`` shift mask
    or None, shared by the ``b`` images of the batch; ``dropout`` on the attention probabilities (training only);
    ``cosine``: V2's per-head logit scale ``(heads, 1, 1)``, for queries and keys not yet normalised; ``packed``: the
    ``(3, B*nW, heads, N, d)`` tensor whose slices are q, k, v, or None (:func:`_split_heads`).
    The branch is on whether there is a mask (never on a size), so a traced graph serves every batch and window
    count; for ``b == 1`` the expand-reshape is a view."""
    bw, heads, n, d = q.shape
    if cosine is not None:
        out = None if dropout else window_attention(q, k, v, pos, mask, scale, cosine)  # normalises inside
        if out is not None:
            return out
        # fp16: normalised in fp32 (a zero padding token's norm is 0, and fp16 has no 1e-12 epsilon)
        q, k = fp32_normalize(q, scale=cosine), fp32_normalize(k)
        packed = None  # its slices are no longer the queries and keys attended
    if _explicit_for_training(q, pos):
        return _attend_explicit(q, k, v, pos, mask, b, scale, dropout, packed)
    if not dropout:
        out = window_attention(q, k, v, pos, mask, scale)  # CPU inference: the fused kernel, else None
        if out is not None:
            return out
    per_window = mask is not None
    bias = pos + mask.unsqueeze(1) if per_window else pos  # (nW | 1, heads, N, N)
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


def _explicit_for_training(q: torch.Tensor, bias: torch.Tensor) -> bool:
    """CPU training with a learnt bias in fp32 / float64, or under CPU bf16 autocast: SDPA's fused CPU kernel has no
    gradient for its mask, so SDPA falls back to its math path (a safe softmax that scans every row for full
    masking, the broadcast bias copied per window, under autocast in fp32 throughout); the explicit products below
    compute the same function 1.2-1.4x faster forward + backward in fp32 (Swin-T's stages at 512x768, batch 2, AMD
    EPYC family 25, 2 threads), and under bf16 autocast they are mmdet's and the official formulation: the products
    in bf16, the bias, mask and softmax in fp32. fp16 autocast keeps SDPA (its math path upcasts the products)."""
    if q.device.type != 'cpu' or not (torch.is_grad_enabled() and bias.requires_grad) or is_tracing():
        return False
    if torch.is_autocast_enabled('cpu'):
        return q.dtype == torch.get_autocast_dtype('cpu') == torch.bfloat16
    return q.dtype in _EXPLICIT_DTYPES and bias.dtype == q.dtype


_EXPLICIT_DTYPES = (torch.float32, torch.float64)


def _attend_explicit(q, k, v, pos: torch.Tensor, mask: torch.Tensor | None, b: int, scale: float | None,
                     dropout: float, packed: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(scale * q k^T + pos + mask) v`` as batched products (mmdet's and the official formulation), the
    position bias and the shift mask broadcast over the windows and the ``b`` images by views; without dropout the
    probabilities are recomputed in the backward instead of kept
    (:func:`mmplugin.models.layers.recompute.window_softmax_attention`). Returns ``(B*nW, N, heads * d)``."""
    bw, heads, n, d = q.shape
    scale = d**-0.5 if scale is None else scale
    if dropout:
        probs = window_softmax(torch.matmul(q * scale, k.transpose(-2, -1)), pos, mask, b)
        out = torch.matmul(F.dropout(probs, dropout), v)
    else:
        out = window_softmax_attention(q, k, v, pos, mask, b, scale, packed)
    return out.transpose(1, 2).reshape(bw, n, heads * d)


class WindowAttentionBase(nn.Module):
    """Multi-head attention within the windows of a ``(B, H, W, C)`` map, written once for Swin V1 and V2.

    ``forward``: :meth:`project` into the windows' q, k, v (on the real tokens only:
    :meth:`~.windows.WindowGeometry.partition_projected`), split into heads -> SDPA with :meth:`attention_scales` and
    :meth:`position_bias` (plus the shift mask) -> reverse -> ``proj`` (+ the block's residual, inside the ``proj``
    GEMM at CPU inference). CPU inference and training run the fused kernels on the map's tokens instead
    (:meth:`_map_attention`). Subclasses create ``proj`` (``nn.Linear(C, C)``), their parameters and the hooks
    :meth:`project`, :meth:`attention_scales`, ``position_bias``.

    Args:
        num_heads (int): heads. window_size (int): ws, the configured window.
        attn_drop (float): dropout on the attention probabilities. proj_drop (float): dropout after ``proj``.
    """

    def __init__(self, num_heads: int, window_size: int, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.num_heads, self.window_size = num_heads, window_size
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)

    def project(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(..., C)`` tokens -> ``(..., 3C)`` queries, keys and values (heads-major within each third)."""
        raise NotImplementedError

    def attention_scales(self) -> tuple[float | None, torch.Tensor | None]:
        """The scale of ``q k^T`` (None: SDPA's ``d ** -0.5``) and, for cosine attention, the per-head logit scale
        ``(heads, 1, 1)`` by which the normalised queries are multiplied (else None: q and k used as they are)."""
        raise NotImplementedError

    def position_bias(self, ws: int | None = None) -> torch.Tensor:
        """``(heads, N, N)`` position bias of a ``ws`` window (default: the configured one), ``N = ws * ws``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, geom: WindowGeometry, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: ``(B, H, W, C)`` block input (already normalised for V1) -> ``(B, H, W, C)``, plus ``residual`` (same
        shape) when given.

        The windows are merged back before ``proj``, which acts per token, so it skips the padding tokens (without
        ``proj`` dropout in training, whose draws keep the window order); with a residual at CPU inference the add runs
        inside the ``proj`` GEMM (:func:`mmplugin.models.layers.fusion.linear_add`), with no separate pass over the
        map."""
        b = x.shape[0]
        out = self._map_attention(x, geom)  # (B, H, W, C) where the fused kernel ran (CPU), else None
        if out is None:
            packed, q, k, v = _split_heads(geom.partition_projected(x, self.project), self.num_heads)
            scale, cosine = self.attention_scales()
            pos = self.position_bias(geom.ws).unsqueeze(0)  # (1, heads, N, N)
            out = _attend(q, k, v, pos, geom.mask, b, scale, self.attn_drop if self.training else 0.0, cosine, packed)
            if self.training and self.proj_drop.p > 0:
                out = geom.reverse(self.proj_drop(linear(out, self.proj)), b)
                return out if residual is None else residual + out
            out = geom.reverse(out, b)
        return linear(out, self.proj) if residual is None else linear_add(out, self.proj, residual)

    def _map_attention(self, x: torch.Tensor, geom: WindowGeometry) -> torch.Tensor | None:
        """q, k, v of the map's real tokens, attended by the plugin's kernel in place of partition, padding and reverse
        (:func:`mmplugin.ops.window_attention.map_window_attention`): at CPU inference (fp32, bf16), and in CPU
        training (fp32, bf16 autocast; V1 and V2 without dropout) with the kernels' backward
        (:func:`mmplugin.models.layers.recompute.map_window_softmax_attention`). Returns ``(B, H, W, C)``, or None
        where they do not apply (decided before the projection, so a fallback never projects twice)."""
        training = torch.is_grad_enabled()
        if x.device.type != 'cpu' or geom.traced or torch.compiler.is_compiling():
            return None
        if training:
            feeds = [p for name, p in self.named_parameters() if not name.startswith('proj.')]  # what q, k, v need
            if (self.attn_drop or self.proj_drop.p or map_attention_dtype(x, *feeds) is None
                    or not kernel_context(x, geom.mask)):
                return None
        else:
            low = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else x.dtype
            if (self.training and (self.attn_drop or self.proj_drop.p)) or low not in (torch.float32, torch.bfloat16) \
                    or not kernel_available():
                return None
        scale, cosine = self.attention_scales()
        b, h, w, c = x.shape
        qkv = self.project(x.reshape(b, h * w, c))
        if not qkv.is_contiguous():
            return None
        pad = self.project(x.new_zeros(1, c)).view(-1)  # a padding token's q, k, v (the projection's bias)
        pos = self.position_bias(geom.ws)
        if training:
            # V2's bias comes from its MLP, bf16 under autocast, and its logit scales from a bf16 model's parameter:
            # the kernels take them in fp32 (the same values)
            out = map_window_softmax_attention(qkv, pad, geom.map_rows(), self.num_heads, pos.float().unsqueeze(0),
                                               geom.kernel_mask(),
                                               (c // self.num_heads)**-0.5 if scale is None else scale,
                                               None if cosine is None else cosine.float())
        else:
            out = map_window_attention(qkv, pad.to(qkv.dtype), geom.map_rows(), self.num_heads, pos,
                                       geom.kernel_mask(), scale, cosine)
        return None if out is None else out.view(b, h, w, c)


class WindowAttention(WindowAttentionBase):
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
        super().__init__(num_heads, window_size, attn_drop=attn_drop, proj_drop=proj_drop)
        self.scale = qk_scale or (dim // num_heads)**-0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1)**2, num_heads))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def project(self, tokens: torch.Tensor) -> torch.Tensor:
        return linear(tokens, self.qkv)

    def attention_scales(self):
        return self.scale, None

    def position_bias(self, ws: int | None = None) -> torch.Tensor:
        """Gathered from the learnt table; a window smaller than the configured one reads the table's centre."""
        ws = ws or self.window_size
        idx = relative_position_index(ws, self.relative_position_bias_table.device, self.window_size)
        # contiguous (heads, N, N): the (nW, heads, N, N) sum with the shift mask then comes out contiguous too, which
        # SDPA would otherwise copy (stage 1 of Swin-T at 800x1216: 37 MB per shifted block)
        return self.relative_position_bias_table[idx.view(-1)].view(ws * ws, ws * ws, -1).permute(2, 0, 1).contiguous()


class WindowAttentionV2(WindowAttentionBase):
    """Swin V2 window attention: scaled cosine attention with log-spaced continuous position bias.

    ``attn = cos(q, k) * exp(min(logit_scale, log 100)) + 16 * sigmoid(cpb_mlp(coords))[index] + mask``.
    q and v have separate biases (k has none). Parameters keep the official names.

    Args:
        pretrained_window_size (int): window the weights were trained with; coordinates are normalised by it.
            0 means the window actually used (``window_size``, or the smaller window of a small map; see
            :func:`coordinate_window`).
        attn_drop (float): dropout on the attention probabilities. proj_drop (float): dropout after ``proj``.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool = True,
                 pretrained_window_size: int = 0, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__(num_heads, window_size, attn_drop=attn_drop, proj_drop=proj_drop)
        self.pretrained_window_size = pretrained_window_size
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
        self.register_buffer('relative_coords_table', self._coords(window_size), persistent=False)

    def _coords(self, ws: int) -> torch.Tensor:
        return log_spaced_coords(ws, coordinate_window(self.pretrained_window_size, ws))

    def project(self, tokens: torch.Tensor) -> torch.Tensor:
        bias = None
        if self.q_bias is not None:
            bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
        return linear(tokens, self.qkv, self.qkv.weight, bias)

    def attention_scales(self):
        """Cosine attention: scale 1, and the clamped per-head logit scale that multiplies the unit-norm q (q and k
        are normalised in ``_attend``, inside the fused kernel where it runs)."""
        return 1.0, torch.exp(torch.clamp(self.logit_scale, max=math.log(100.0)))  # (heads, 1, 1): at most 100

    def position_bias(self, ws: int | None = None) -> torch.Tensor:
        """From the CPB MLP; a smaller window on a small map (``pad_small_map=False``) gets its own coordinates,
        as the official code builds them."""
        ws = ws or self.window_size
        if ws == self.window_size:
            coords = self.relative_coords_table
        else:
            coords = self._coords(ws).to(self.relative_coords_table)
        idx = relative_position_index(ws, coords.device).view(-1)
        if torch.compiler.is_compiling() and torch.is_grad_enabled():
            # Compiled training: the MLP runs on the gathered coordinates ((ws^2)^2 rows instead of (2ws-1)^2; the
            # same values, row by row), so the backward holds no scatter-add over the repeated indices. Inductor's
            # CPU code for that scatter-add loses updates on several threads (torch 2.13: the CPB gradients of
            # every padded stage 80-150% off on 2 threads, exact on 1; tests/models/test_precision.py).
            rows = self.cpb_mlp(coords.view(-1, 2)[idx])
        else:
            rows = self.cpb_mlp(coords).view(-1, self.num_heads)[idx]
        return 16 * torch.sigmoid(rows.view(ws * ws, ws * ws, -1).permute(2, 0, 1).contiguous())  # as V1's
