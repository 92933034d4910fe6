"""Window geometry of Swin's shifted-window attention: padding sizes, window partition and its inverse.

Feature maps are ``(B, H, W, C)`` (channels last). Windows follow the official detection code: the block input is
zero-padded at the bottom/right to a multiple of the window, cyclically shifted by ``-shift``, cut into
``ws x ws`` windows; the inverse undoes the shift and crops the padding. The cyclic shift and the partition are one
``index_select`` with a cached permutation, and the reverse + un-shift + crop is another, so each direction
copies the map once. The shift mask is built once per stage and forward from cached per-position region labels
(and an fp32 copy for the window-attention kernels where the map is bf16 or fp16).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

__all__ = ['MASK_VALUE', 'PROJECT_FIRST_MIN', 'WindowGeometry', 'index_cache', 'is_tracing', 'must_pad', 'padded_size',
           'shift_mask', 'window_index']

MASK_VALUE = -100.0  # the fill value of every Swin implementation; finite, so safe in fp16/bf16


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


def index_cache(build):
    """``lru_cache`` of an index builder (eager only: keys are hashable ints), whose tensors are made outside
    inference mode: a cache first filled under ``torch.inference_mode()`` would hand inference tensors to a later
    training forward, which cannot save them for backward (index_select / gathers save their indices)."""
    @lru_cache(maxsize=64)
    def cached(*args):
        with torch.inference_mode(False):
            return build(*args)
    return cached


_window_index = index_cache(window_index)


@index_cache
def _map_rows(h: int, w: int, ws: int, shift: int, device: torch.device) -> torch.Tensor:
    """``(nW, ws*ws)`` int64: each window token's row in the unpadded ``(H*W)`` map (shift included), -1 for padding."""
    fwd = _window_index(h, w, ws, shift, device)[0]
    wp = padded_size(w, ws)
    r, c = fwd // wp, fwd % wp
    rows = torch.where((r < h) & (c < w), r * w + c, torch.full_like(fwd, -1))
    return rows.to(torch.int64).view(-1, ws * ws).contiguous()


# Projecting before the partition saves, per padding token, the q, k, v GEMM rows (forward and both gradients: 18 C^2
# FLOPs), and costs, per real token, gathering 3C channels instead of C (2C more values read and written in each
# direction: 32 C bytes more in fp32 for forward + backward). So it pays where padding tokens / real tokens x C is
# large; the threshold is measured: a Swin-T block's forward + backward at batch 2 (AMD EPYC family 25 model 17, 2
# threads, fp32 and bf16 autocast) ran 5-10% slower with 6% padding tokens per real token x 96 channels (= 6), about
# level at 12% x 192 (= 22), 2-4% faster at 12% x 384 (= 45) and 8-14% faster at 53% x 768 (= 408): Swin-T's four stages
# at 512x768.
PROJECT_FIRST_MIN = 32


@index_cache
def _token_windows(h: int, w: int, ws: int, shift: int, device: torch.device):
    """``(src, pad)`` for :meth:`WindowGeometry.partition_projected` (``_PartitionTokens``): ``src`` ``(Hp*Wp,)`` the
    unpadded map row each window position reads (0 for padding, overwritten), ``pad`` the window positions that are
    padding."""
    rows = _map_rows(h, w, ws, shift, torch.device('cpu')).flatten()  # nonzero needs values: not on a meta device
    return rows.clamp(min=0).to(device), (rows < 0).nonzero().flatten().to(device)


def shift_mask(label: torch.Tensor, dtype: torch.dtype, traced: bool) -> torch.Tensor:
    """The ``(nW, N, N)`` shift mask from the ``(nW, N)`` region labels, in the map's dtype (a ``.half()`` model stays
    fp16): 0 where two positions of a window share a shift region, ``MASK_VALUE`` across (exact in every float format).

    Only the windows of the last window row and column hold more than one region. Eager on a CPU, the mask is zeros
    (-0.0, as the product gives) with just those windows computed (Swin-T's first stage at 800x1216: 72 of 1276
    windows), where the whole comparison cast and scaled took three passes over the 12 MB mask per stage and forward;
    traced, and on other devices, every window is computed (no data-dependent indexing in the graph, no device sync).
    Both give the same mask bit for bit."""
    if traced or label.device.type != 'cpu':
        return (label[:, :, None] != label[:, None, :]).to(dtype) * MASK_VALUE
    nw, n = label.shape
    mask = torch.full((nw, n, n), -0.0, dtype=dtype)  # the sign the product below gives (0 * MASK_VALUE): bit for bit
    mixed = (label != label[:, :1]).any(1).nonzero().flatten()
    part = label[mixed]
    mask[mixed] = (part[:, :, None] != part[:, None, :]).to(dtype) * MASK_VALUE
    return mask


class WindowGeometry:
    """Per-stage description of how an ``(H, W)`` map is windowed; computed once and shared by its blocks.

    ``dtype`` is the map's: the shift mask is made in it, so a half-precision model adds no fp32 tensor (the
    window-attention kernels, eager on a CPU, take an fp32 copy: :meth:`kernel_mask`). Eager: the index tensors come
    from a cache keyed by the size, so only the ``(nW, N, N)`` shift mask is built per stage and forward. While
    tracing (``h``, ``w`` may be SymInts), the same indices are computed in the graph and the map is always padded, so
    exported / compiled models run at any size with eager's exact arithmetic.
    """

    def __init__(self, h: int, w: int, ws: int, shift: int, device: torch.device, dtype: torch.dtype = torch.float32):
        self.h, self.w, self.ws, self.shift = h, w, ws, shift
        self.hp, self.wp = padded_size(h, ws), padded_size(w, ws)
        self.num_windows = (self.hp // ws) * (self.wp // ws)
        self.traced = is_tracing() or not isinstance(h, int) or not isinstance(w, int)
        index = window_index if self.traced else _window_index
        self.fwd, self.inv, self._label = index(h, w, ws, shift, device)
        self.mask = None if self._label is None else shift_mask(self._label, dtype, self.traced)
        self._kernel_mask: torch.Tensor | None = None

    def kernel_mask(self) -> torch.Tensor | None:
        """The shift mask in fp32, as the window-attention kernels add it (eager only): for a bf16 / fp16 map made
        once per geometry from the region labels and shared by its blocks, where converting the map's mask at every
        shifted block took 3.6 ms at Swin-T's first stage (1276 x 49 x 49 at 800x1216, 2 threads, Intel Xeon family
        6 model 167). The mask's values are exact in every format: the same mask."""
        if self.mask is None or self.mask.dtype == torch.float32:
            return self.mask
        if self._kernel_mask is None:
            self._kernel_mask = shift_mask(self._label, torch.float32, self.traced)
        return self._kernel_mask

    def map_rows(self) -> torch.Tensor:
        """``(nW, ws*ws)`` int64 rows of the unpadded map for each window token, -1 for padding (eager only): what
        :func:`mmplugin.ops.window_attention.map_window_attention` gathers in place of :meth:`partition`."""
        return _map_rows(self.h, self.w, self.ws, self.shift, self.fwd.device)

    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, W, C)`` -> ``(B * nW, ws*ws, C)``: pad bottom/right, cyclic shift, cut windows."""
        if _gather_with_adjoint(x):
            return _Partition.apply(x, self)
        return self._partition(x)

    def partition_projected(self, x: torch.Tensor, project) -> torch.Tensor:
        """``project`` (a per-token function ``(..., C) -> (..., D)``, e.g. the q, k, v projection) of the windows of
        ``x``: ``(B, H, W, C)`` -> ``(B * nW, ws*ws, D)``, as ``project(self.partition(x))``.

        Eager, where the padding is a large enough share (:data:`PROJECT_FIRST_MIN`), ``project`` runs on the
        ``B*H*W`` real tokens and once on a zero token, whose result fills the padding positions: no GEMM rows for
        the padding tokens (7x7 windows add 12% padding tokens to a 32 x 48 map, 53% to a 16 x 24 one)."""
        b, h, w, c = x.shape
        if self.traced or (self.hp * self.wp - h * w) * c < PROJECT_FIRST_MIN * h * w:
            return project(self.partition(x))
        return _PartitionTokens.apply(project(x.reshape(b, h * w, c)), project(x.new_zeros(1, c)).view(-1), self)

    def reverse(self, win: torch.Tensor, b: int) -> torch.Tensor:
        """``(B * nW, ws*ws, C)`` -> ``(B, H, W, C)``: merge windows, undo the shift, crop the padding."""
        if _gather_with_adjoint(win):
            return _Reverse.apply(win, self, b)
        return self._reverse(win, b)

    def _partition(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        if self.traced or (self.hp, self.wp) != (h, w):
            x = F.pad(x, (0, 0, 0, self.wp - w, 0, self.hp - h))
        x = x.reshape(b, self.hp * self.wp, c).index_select(1, self.fwd)
        return x.view(b * self.num_windows, self.ws * self.ws, c)

    def _reverse(self, win: torch.Tensor, b: int) -> torch.Tensor:
        c = win.shape[-1]
        return win.reshape(b, self.hp * self.wp, c).index_select(1, self.inv).view(b, self.h, self.w, c)


# ------------------------------------------------------------------------- gradients of the window gathers
# ``partition`` is a zero pad followed by a permutation of the padded positions, and ``reverse`` is the inverse
# permutation followed by the crop, so each is the other's adjoint (transpose). Autograd's own backward of an
# ``index_select`` zero-fills the input's shape and scatter-adds into it (``index_add_``); the adjoint is one more
# gather, with no zero fill and no scatter.
def _gather_with_adjoint(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad and not is_tracing()


class _Partition(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, geom):
        ctx.geom, ctx.b = geom, x.shape[0]
        return geom._partition(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.geom._reverse(grad.contiguous(), ctx.b), None


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, win, geom, b):
        ctx.geom = geom
        return geom._reverse(win, b)

    @staticmethod
    def backward(ctx, grad):
        return ctx.geom._partition(grad.contiguous()), None, None


class _PartitionTokens(torch.autograd.Function):
    """Gather of the real tokens' features into the windows, the padding positions filled with ``pad``; its adjoint
    is the inverse gather for the tokens and the sum over the padding positions for ``pad``."""

    @staticmethod
    def forward(ctx, tokens, pad, geom):
        src, pad_pos = _token_windows(geom.h, geom.w, geom.ws, geom.shift, tokens.device)
        ctx.geom, ctx.pad_pos, ctx.pad_shape = geom, pad_pos, pad.shape
        b, _, d = tokens.shape
        win = tokens.index_select(1, src)
        win[:, pad_pos] = pad.to(win.dtype)
        return win.view(b * geom.num_windows, geom.ws * geom.ws, d)

    @staticmethod
    def backward(ctx, grad):
        geom = ctx.geom
        grad = grad.reshape(-1, geom.hp * geom.wp, grad.shape[-1])
        g_tokens = grad.index_select(1, geom.inv) if ctx.needs_input_grad[0] else None
        g_pad = grad.index_select(1, ctx.pad_pos).sum((0, 1)).view(ctx.pad_shape) if ctx.needs_input_grad[1] else None
        return g_tokens, g_pad, None
