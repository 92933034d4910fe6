"""Window attention on CPUs: ``softmax(scale * q k^T + pos + mask) v`` per window and head, fused in one C
kernel (``window_attention.c``, built on first use for the vector ISA torch dispatches to; :mod:`mmplugin.ops.build`).

Why: Swin's windows hold 49 tokens. PyTorch's CPU SDPA kernel tiles for long sequences and, on Swin-T at 800x1216 on
two Zen 4 cores, spends about a sixth of the eager fp32 forward (a fifth under bf16 autocast) in attention whose
products are 3% of the model's multiply-adds; the explicit batched products move the (windows, heads, N, N) scores
through memory three times. The kernel packs each window's heads once, keeps a few query rows' scores in vector
registers and the softmax in cache, and adds the position bias and the shift mask in fp32.

Training (fp32, bf16 under autocast): :func:`window_attention_grad` is the backward, recomputing the probabilities per
window in cache and writing the gradient in the fused projection's layout; :mod:`mmplugin.models.layers.recompute`
pairs it with :func:`window_attention` as the forward of an autograd function.

Scope of :func:`window_attention`: no autograd of its own, fp32 and bf16 queries
(bf16 is computed in fp32 and rounded once on the store; on CPUs with AVX512-BF16 the products take the bf16
operands two per lane, or on AMX tiles where the process may use them, the probabilities rounded to bf16 for their
product with v, as a bf16 matmul would), no
dropout, not while tracing, exporting or compiling (the graphs keep SDPA, which the exporters and inductor know).
Elsewhere :func:`window_attention` returns None and the caller runs SDPA. Non-finite values give the formulation's
IEEE results (NaN rows where a score is NaN or +inf, NaN or inf values reaching every query of their window);
tests/engine/test_window_attention.py checks them against the float64 formulation.
"""
from __future__ import annotations

import ctypes
import weakref

import torch

from mmplugin.ops.build import kernel_library
from mmplugin.ops.eligible import eager_context, plain_cpu
from mmplugin.utils.cpu import native_amx

__all__ = ['available', 'window_attention', 'map_window_attention', 'fast_kernel_applies', 'window_attention_grad',
           'map_window_attention_grad']

_SUFFIX = {torch.float32: 'f32', torch.bfloat16: 'bf16'}
_ARGS = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 9 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [
    ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
    ctypes.c_int64]


_GRAD_ARGS = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_float] + [ctypes.c_void_p] * 4 + [
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


def _kernels() -> ctypes.CDLL | None:
    """The library for the current ISA, or None where it cannot be built (warned once per ISA, not retried). An
    AVX512_BF16 build has its bf16 products on AMX tiles switched on where this process may use them
    (:func:`mmplugin.utils.cpu.native_amx`: AMX hardware, ``ONEDNN_MAX_CPU_ISA`` not below it)."""
    lib = kernel_library('window_attention', {**{f'mmplugin_window_attention_{s}': _ARGS for s in _SUFFIX.values()},
                                              **{f'mmplugin_window_attention_grad_{s}': _GRAD_ARGS
                                                 for s in _SUFFIX.values()}},
                         'Swin window attention runs in PyTorch SDPA')
    if lib is not None and id(lib) not in _amx_set:
        set_amx(lib, native_amx())
    return lib


_amx_set: dict[int, bool] = {}  # id of a library -> whether its AMX path is on


def set_amx(lib: ctypes.CDLL, on: bool) -> bool:
    """Switch the AMX path of ``lib`` (a window-attention build) on or off; returns whether it is on (False where the
    build has none, the CPU lacks AMX or Linux does not grant the tile state)."""
    fn = getattr(lib, 'mmplugin_window_attention_use_amx', None)
    if fn is None:
        _amx_set[id(lib)] = False
        return False
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    _amx_set[id(lib)] = bool(fn(int(on)))
    return _amx_set[id(lib)]


def available() -> bool:
    """Whether the kernel for the current ISA is built (building it on first call; warned once where it cannot)."""
    return _kernels() is not None


def fast_kernel_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0) -> bool:
    """Whether :func:`window_attention` runs the kernel for these ``(windows, heads, N, d)`` queries, keys, values."""
    return (eager_context() and all(plain_cpu(t) for t in (q, k, v))
            and q.dtype in _SUFFIX and k.dtype == v.dtype == q.dtype and not dropout
            and q.dim() == k.dim() == v.dim() == 4 and q.shape == k.shape == v.shape
            and all(t.stride(-1) == 1 for t in (q, k, v))
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and _kernels() is not None)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None = None, cosine: torch.Tensor | None = None) -> torch.Tensor | None:
    """``softmax(scale * q k^T + pos + mask) v`` with the heads merged, or None where the kernel does not apply.
    With ``cosine`` (Swin V2), ``q`` and ``k`` are normalised first and ``q`` scaled per head:
    ``q <- F.normalize(q) * cosine``, ``k <- F.normalize(k)``; bf16 on CPUs with bf16 dot products (AVX512-BF16,
    AMX) rounds these q and k to bf16 once each for its bf16 products, as autocast's bf16 product of them would.

    Args:
        q, k, v: ``(B*nW, heads, N, d)``, windows image-major (window ``w`` of the batch is window ``w % nW`` of its
            image); any window / head / token strides with contiguous ``d`` (the views of a fused qkv projection).
        pos: the position bias, ``(heads, N, N)`` or ``(1, heads, N, N)`` (fp32 or bf16; added in fp32).
        mask: the shift mask ``(nW, N, N)`` or None; nW must divide the window count.
        scale: factor of ``q k^T`` (default ``d ** -0.5``).
        cosine: the per-head logit scale, ``heads`` values (any shape), or None.

    Returns ``(B*nW, N, heads * d)`` in ``q``'s dtype.
    """
    if q.device.type == 'cpu' and torch.is_autocast_enabled('cpu') and not q.dtype == k.dtype == v.dtype:
        # what autocast does for SDPA: its operands in the autocast dtype
        low = torch.get_autocast_dtype('cpu')
        q, k, v = q.to(low), k.to(low), v.to(low)
    if not fast_kernel_applies(q, k, v) or (torch.is_grad_enabled() and pos.requires_grad):
        return None
    bw, heads, n, d = q.shape
    out = q.new_empty(bw, n, heads * d)
    return _run(q, k, v, pos, mask, scale, cosine, out, bw, mask.shape[0] if mask is not None else 1)


def map_window_attention(qkv: torch.Tensor, pad: torch.Tensor, rows: torch.Tensor, heads: int, pos: torch.Tensor,
                         mask: torch.Tensor | None, scale: float | None = None,
                         cosine: torch.Tensor | None = None) -> torch.Tensor | None:
    """:func:`window_attention` with the windows gathered from the map and the output written back to it: the
    partition and its reverse (two copies of the map) are replaced by the kernel's own reads and writes, and the
    projection runs on the map's real tokens only.

    Args:
        qkv: ``(B, L, 3C)`` projection of the map's ``L = H * W`` tokens (row stride free, channels contiguous).
        pad: ``(3C,)`` the projection of a zero token, which the padding tokens of the windows hold.
        rows: ``(nW, N)`` int64, each window token's row in its image's map (the cyclic shift included), -1 for
            padding; every row appears exactly once.
        heads, pos, mask, scale, cosine: as :func:`window_attention`.

    Returns ``(B, L, C)`` in ``qkv``'s dtype, or None where the kernel does not apply.
    """
    c3 = qkv.shape[-1]
    q, k, v = (qkv[..., i * c3 // 3:(i + 1) * c3 // 3].unflatten(-1, (heads, -1)) for i in range(3))
    if qkv.dim() != 3 or not qkv.is_contiguous():
        return None
    b, length = qkv.shape[:2]
    nw, n = rows.shape
    # (B, L, heads, d) views: token stride = row stride, head stride = d; the window stride is unused
    q4, k4, v4 = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, L, d): the stride layout window_attention reads
    if not fast_kernel_applies(q4, k4, v4):
        return None
    if not (plain_cpu(pad) and plain_cpu(rows)):
        return None
    if pad.dtype != qkv.dtype or pad.shape != (c3, ) or rows.dtype != torch.int64 or not rows.is_contiguous():
        raise ValueError('map window attention: pad must be the (3C,) projection of a zero token in qkv\'s dtype and '
                         'rows a contiguous int64 (nW, N) tensor')
    _check_rows(rows, length)
    out = qkv.new_empty(b, length, c3 // 3)
    pad = pad.contiguous()
    # explicit strides: a size-1 dimension of the views may carry any stride
    strides = (0, c3 // 3 // heads, c3)
    return _run(q4, k4, v4, pos, mask, scale, cosine, out, b * nw, nw, rows=rows, pad=pad, image_rows=length,
                n=n, strides=strides)


_checked_rows: dict[int, tuple] = {}  # id -> (weak reference, version, length); tensors compare elementwise


def _check_rows(rows: torch.Tensor, length: int) -> None:
    """``rows`` names every one of the ``length`` map rows exactly once, and -1 otherwise (the kernel reads and
    writes through it). Checked once per index tensor and version (the model's come from a cache)."""
    seen = _checked_rows.get(id(rows))
    if seen is not None and seen[0]() is rows and seen[1:] == (rows._version, length):
        return
    real = rows[rows >= 0]
    ok = (bool((rows >= -1).all()) and real.numel() == length
          and (length == 0 or (int(real.max()) < length and bool((torch.bincount(real, minlength=length) == 1).all()))))
    if not ok:
        raise ValueError(f'map window attention: rows must name each of the {length} map rows exactly once (-1 for '
                         'padding tokens)')
    if len(_checked_rows) > 256:
        _checked_rows.clear()
    _checked_rows[id(rows)] = (weakref.ref(rows), rows._version, length)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _run(q, k, v, pos, mask, scale, cosine, out, windows: int, nw: int, rows=None, pad=None, image_rows: int = 0,
         n: int | None = None, strides: tuple[int, int, int] | None = None) -> torch.Tensor | None:
    """The kernel call shared by both layouts: checks, fp32 bias and logit scale, the call, its error."""
    heads, d = q.shape[1], q.shape[3]
    n = q.shape[2] if n is None else n
    if not all(plain_cpu(t) for t in (pos, mask, cosine)):
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (pos, mask, cosine)):
        return None
    pos = pos.reshape(heads, n, n).float().contiguous()
    if mask is not None:
        mask = mask.float().contiguous()
        if mask.dim() != 3 or mask.shape[1:] != (n, n) or windows % mask.shape[0] or mask.shape[0] != nw:
            raise ValueError(f'window attention: mask of shape {tuple(mask.shape)} for {windows} windows of {n} '
                             'tokens')
    if cosine is not None:
        if cosine.numel() != heads:
            raise ValueError(f'window attention: {cosine.numel()} logit scales for {heads} heads')
        cosine = cosine.detach().float().reshape(heads).contiguous()
    fn = getattr(_kernels(), f'mmplugin_window_attention_{_SUFFIX[q.dtype]}')
    qs, ks, vs = (strides, ) * 3 if strides else (q.stride()[:3], k.stride()[:3], v.stride()[:3])
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), *qs, *ks, *vs,
            pos.data_ptr(), _ptr(mask), _ptr(cosine), nw, heads, n, d, d**-0.5 if scale is None else float(scale),
            out.data_ptr(), _ptr(rows), _ptr(pad), image_rows, torch.get_num_threads())
    with torch.profiler.record_function('mmplugin::window_attention'):  # named in profiles (the speed notes use it)
        failed = fn(*args, 0, windows)  # parallel inside, on torch.get_num_threads() OpenMP threads
    if failed:
        raise MemoryError('window attention: out of memory for the scratch buffers')
    return out


def window_attention_grad(qkv: torch.Tensor, grad: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                          heads: int, scale: float, cosine: torch.Tensor | None = None) -> tuple | None:
    """The gradients of ``out = softmax(scale * q k^T + pos + mask) v`` (heads merged, as :func:`window_attention`
    returns it) with respect to the fused projection and the position bias, recomputing the probabilities in the
    kernel (``window_attention_grad.h``), or None where the kernel is not built. fp32 or bf16 (computed in fp32, the
    gradient rounded once).

    Args:
        qkv: ``(B*nW, N, 3C)`` contiguous fp32 or bf16, each token's q, k, v with the heads side by side
            (``C = heads * d``).
        grad: ``(B*nW, N, C)``, the gradient of the output.
        pos: the ``(heads, N, N)`` position bias (any leading ones). mask: the ``(nW, N, N)`` shift mask or None.
        cosine: Swin V2's per-head logit scale (``heads`` values, any shape) or None, as :func:`window_attention`:
            the scores are ``scale * cosine[h] * F.normalize(q) F.normalize(k)^T + pos + mask``.

    Returns ``(dqkv, dpos)``: ``(B*nW, N, 3C)`` in qkv's dtype and the ``(heads, N, N)`` sum over the windows, fp32;
    with ``cosine`` also the ``(heads,)`` fp32 gradient of the logit scales, ``(dqkv, dpos, dcos)``.
    """
    bw, n, c3 = qkv.shape
    out = _grad(qkv, grad, pos, mask, heads, scale, bw, n, None, None, cosine)
    return None if out is None else (out[:2] if cosine is None else (out[0], out[1], out[3]))


def map_window_attention_grad(qkv: torch.Tensor, grad: torch.Tensor, pad: torch.Tensor, rows: torch.Tensor,
                              heads: int, pos: torch.Tensor, mask: torch.Tensor | None, scale: float,
                              cosine: torch.Tensor | None = None) -> tuple | None:
    """:func:`window_attention_grad` for :func:`map_window_attention`'s layout: the windows read from the map's
    projection through ``rows``, the gradient written to the map's rows (each once) and the padding tokens' summed
    into ``pad``'s, in place of the gathers of the window partition and its reverse and their adjoints.

    Args:
        qkv: ``(B, L, 3C)`` contiguous fp32 or bf16, the projection of the map's ``L`` tokens. grad: ``(B, L, C)``.
        pad: ``(3C,)`` the projection of a zero token. rows: ``(nW, N)`` int64 as :func:`map_window_attention`'s.
        heads, pos, mask, scale, cosine: as :func:`window_attention_grad`.

    Returns ``(dqkv, dpos, dpad)``: ``(B, L, 3C)`` in qkv's dtype, ``(heads, N, N)`` and ``(3C,)`` in fp32; with
    ``cosine`` also the ``(heads,)`` fp32 logit-scale gradient, ``(dqkv, dpos, dpad, dcos)``; None where the kernel is
    not built.
    """
    if rows.dtype != torch.int64 or rows.dim() != 2 or not rows.is_contiguous() or pad.shape != qkv.shape[-1:]:
        raise ValueError('map window attention gradient: rows must be a contiguous int64 (nW, N) tensor and pad the '
                         '(3C,) projection of a zero token')
    _check_rows(rows, qkv.shape[1])
    out = _grad(qkv, grad, pos, mask, heads, scale, qkv.shape[0] * rows.shape[0], rows.shape[1], rows,
                pad.detach().to(qkv.dtype).contiguous(), cosine)
    return None if out is None else (out[:3] if cosine is None else out)


def _grad(qkv, grad, pos, mask, heads, scale, windows, n, rows, pad, cosine=None):
    """The gradient kernel's call shared by both layouts: checks, the call, its error."""
    lib = _kernels()
    if lib is None:
        return None
    c3 = qkv.shape[-1]
    if (qkv.dtype not in _SUFFIX or qkv.dim() != 3 or not qkv.is_contiguous() or c3 % (3 * heads)
            or grad.shape != (*qkv.shape[:2], c3 // 3)):
        raise ValueError(f'window attention gradient: qkv must be a contiguous fp32 or bf16 3-d tensor of 3C channels '
                         f'and grad its output gradient of C; got {tuple(qkv.shape)} {qkv.dtype} and '
                         f'{tuple(grad.shape)}')
    nw = rows.shape[0] if rows is not None else 1 if mask is None else mask.shape[0]  # the windows of an image
    if mask is not None and (mask.shape != (nw, n, n) or windows % nw):
        raise ValueError(f'window attention gradient: mask of shape {tuple(mask.shape)} for {windows} windows of {n} '
                         'tokens')
    grad = grad.to(qkv.dtype).contiguous()
    pos = pos.detach().reshape(heads, n, n).float().contiguous()
    mask = None if mask is None else mask.detach().float().contiguous()
    if cosine is not None:
        if cosine.numel() != heads:
            raise ValueError(f'window attention gradient: {cosine.numel()} logit scales for {heads} heads')
        cosine = cosine.detach().float().reshape(heads).contiguous()
    dqkv = torch.empty_like(qkv)
    dpos, dpad = torch.zeros(heads, n, n, dtype=torch.float32), torch.zeros(c3, dtype=torch.float32)
    dcos = None if cosine is None else torch.zeros(heads, dtype=torch.float32)
    with torch.profiler.record_function('mmplugin::window_attention_grad'):
        failed = getattr(lib, f'mmplugin_window_attention_grad_{_SUFFIX[qkv.dtype]}')(
            qkv.data_ptr(), grad.data_ptr(), pos.data_ptr(), _ptr(mask), windows, nw, heads, n, c3 // (3 * heads),
            float(scale), dqkv.data_ptr(), dpos.data_ptr(), _ptr(rows), _ptr(pad), qkv.shape[1] if rows is not None
            else 0, dpad.data_ptr(), torch.get_num_threads(), _ptr(cosine), _ptr(dcos))
    if failed:
        raise MemoryError('window attention gradient: out of memory for the scratch buffers')
    return dqkv, dpos, dpad, dcos
