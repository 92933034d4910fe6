"""Training ops that keep less for the backward pass: each saves its inputs and recomputes a cheap elementwise,
normalisation or softmax result in the backward, where autograd would keep that result for the whole step.

Why: a backbone's training step holds every block's saved tensors until its backward reaches them, and the widest of
them are recomputable in one pass. In a pre-norm Swin block autograd keeps the MLP's hidden map twice (``h = fc1(x)``
for GELU's gradient and ``GELU(h)`` for fc2's weight gradient: 8C values per token), the normalised MLP input (C)
and the attention probabilities (``heads * N`` per token, more than C in every stage). The GEMMs are not repeated
(that is what activation checkpointing trades); the backward repeats one GELU, one LayerNorm and one ``(N, N)``
product + softmax per window and head. Swin-T, 512x768, batch 2, fp32 (AMD EPYC family 23 model 49, 2 threads):
the tensors kept for the backward go from 1795 MiB (mmdet's Swin keeps the same) to 1229 MiB, the step's peak RSS
growth from about 2025 to 1637 MiB (mmdet 2057), for 3% more step time (4441 vs 4307 ms, interleaved in one process);
docs/benchmarks.md has the command.

The functions compute what the plain ops compute with the same kernels (their linears those of
:func:`mmplugin.models.layers.gemm.train_linear`), so the forward is bit-identical and the backward differs only by
floating-point reassociation inside the kernels (and, where :func:`mmplugin.ops.gelu.gelu_grad` runs, by its erf:
a few fp32 ulps). They apply in eager autograd on the CPU in float32 / float64 (:func:`recompute_applies`);
elsewhere (CUDA, autocast, tracing, export, ``torch.compile``, which plans its own recomputation) the callers use the
plain ops.

The window attention's exception: where the C kernels are built, the fp32 attention (under CPU bf16 autocast the
bf16 one, :func:`map_attention_dtype`) runs in them, forward and backward, within their error bounds of the
formulation: on the map's layout (:class:`_KernelMapAttention`, V1 and V2's cosine attention) or a packed projection
(:class:`_KernelWindowAttention`, V1). Training steps at 512x768, batch 2, Intel Xeon family 6 model 167, 2 threads
(docs/benchmarks.md): Swin-T fp32 3004 -> 2431 ms, bf16 1415 -> 1233 ms; Swin V2-T 2488 -> 1933 / 1148 -> 872 ms.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mmplugin.models.layers.gemm import input_grad, product
from mmplugin.models.layers.precision import REDUCED_DTYPES, autocast_dtype
from mmplugin.ops.eligible import eager_context, plain_cpu
from mmplugin.ops.gelu import applies as gelu_kernel_applies
from mmplugin.ops.gelu import gelu_grad
from mmplugin.ops.window_attention import available as kernel_available
from mmplugin.ops.window_attention import (
    map_window_attention,
    map_window_attention_grad,
    window_attention,
    window_attention_grad,
)

__all__ = ['recompute_applies', 'layer_norm_linear', 'gelu_linear', 'window_softmax', 'window_softmax_attention',
           'map_attention_dtype', 'map_window_softmax_attention', 'kernel_context']

_DTYPES = (torch.float32, torch.float64)


def recompute_applies(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether the recomputing functions serve an op on ``x`` with ``params``: eager autograd on the CPU in float32 /
    float64 with a gradient to compute (``x`` or a parameter requires one; a frozen module keeps its inference
    path), not traced, exported or compiled, and no autocast (whose dtype the functions would otherwise have to
    replay in the backward). The backward functions are first-order only (``once_differentiable``): a second
    derivative through them is an error, not a wrong number."""
    return x.dtype in _DTYPES and not torch.is_autocast_enabled('cpu') and _eager_cpu_training(x, params)


def _eager_cpu_training(x: torch.Tensor, params) -> bool:
    return (x.device.type == 'cpu' and torch.is_grad_enabled()
            and (x.requires_grad or any(p is not None and p.requires_grad for p in params))
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
            and not torch.compiler.is_exporting() and not torch.onnx.is_in_onnx_export())


def map_attention_dtype(x: torch.Tensor, *params: torch.Tensor | None) -> torch.dtype | None:
    """The dtype in which :func:`map_window_softmax_attention` would serve an attention on the map ``x`` with the
    q, k, v projection's ``params``: fp32 in eager fp32 CPU training (as :func:`recompute_applies`), bf16 under CPU
    bf16 autocast (the projection's output then is bf16; the kernels compute in fp32, rounding the output once, on
    AVX512-BF16 CPUs V1's probabilities for their product with v too, V2's fp32 throughout); or None."""
    if not _eager_cpu_training(x, params):
        return None
    if not torch.is_autocast_enabled('cpu'):
        return torch.float32 if x.dtype == torch.float32 else None
    low = torch.get_autocast_dtype('cpu')
    return low if low == torch.bfloat16 and x.dtype in (torch.float32, low) else None


class _GeluLinear(torch.autograd.Function):
    """``F.linear(GELU(h), weight, bias)`` saving ``h`` (not ``GELU(h)``): the backward recomputes ``GELU(h)``
    for the weight gradient, in the same pass as GELU's gradient where the plugin's kernel runs
    (:func:`mmplugin.ops.gelu.gelu_grad`: one read of ``h``, erf computed once)."""

    @staticmethod
    def forward(ctx, h, weight, bias):
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        return product(F.gelu(h), weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        d_h = d_w = d_b = act = None
        fused = need[0] and gelu_kernel_applies(h)
        if fused:  # grad @ W on BLAS, then GELU's gradient in place and GELU(h) from the same pass
            d_h = torch.matmul(grad, weight)
            _, act = gelu_grad(h, d_h, act=need[1], out=d_h)
        elif need[0]:  # one (M, K) buffer: GELU(h) for the weight gradient, then grad @ W and GELU's backward in place
            buf = F.gelu(h) if need[1] else None
            d_w = None if buf is None else g2.t().mm(buf.reshape(-1, h.shape[-1]))  # (N, K)
            reuse = buf is not None and buf.is_contiguous()
            d_h = torch.matmul(grad, weight, out=buf) if reuse else grad.matmul(weight)
            torch.ops.aten.gelu_backward.grad_input(d_h, h, grad_input=d_h)  # elementwise: in place is exact
        if need[1] and d_w is None:
            act = F.gelu(h) if act is None else act
            d_w = g2.t().mm(act.reshape(-1, h.shape[-1]))  # (N, K)
        if ctx.has_bias and need[2]:
            d_b = g2.sum(0)
        return d_h, d_w, d_b


def gelu_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(F.gelu(h), weight, bias)`` (exact erf GELU) on ``(..., K)`` -> ``(..., N)``, keeping only ``h``
    for the backward where :func:`recompute_applies`; the plain ops elsewhere."""
    if recompute_applies(h, weight, bias):
        return _GeluLinear.apply(h, weight, bias)
    return F.linear(F.gelu(h), weight, bias)


class _LayerNormLinear(torch.autograd.Function):
    """``F.linear(F.layer_norm(x, (C,), gamma, beta, eps), weight, bias)`` saving ``x`` and the per-token mean and
    reciprocal deviation, not the normalised map: the backward recomputes it for the weight gradient."""

    @staticmethod
    def forward(ctx, x, gamma, beta, eps, weight, bias):
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], gamma, beta, eps)
        ctx.save_for_backward(x, mean, rstd, gamma, beta, weight)
        ctx.has_bias, ctx.eps = bias is not None, eps
        return product(y, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, mean, rstd, gamma, beta, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        d_w = d_b = None
        if need[4]:
            y = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], gamma, beta, ctx.eps)[0]  # the forward's own
            d_w = g2.t().mm(y.reshape(-1, x.shape[-1]))
        if ctx.has_bias and need[5]:
            d_b = g2.sum(0)
        d_x, d_gamma, d_beta = torch.ops.aten.native_layer_norm_backward(
            input_grad(grad, weight), x, [x.shape[-1]], mean, rstd, gamma, beta, [need[0], need[1], need[2]])
        return d_x, d_gamma, d_beta, None, d_w, d_b


def layer_norm_linear(x: torch.Tensor, norm: torch.nn.LayerNorm, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(norm(x), weight, bias)`` on ``(..., C)`` -> ``(..., N)``, keeping ``x`` and the norm's per-token
    statistics for the backward, not ``norm(x)``, where :func:`recompute_applies`; the plain ops elsewhere."""
    if (norm.elementwise_affine and norm.weight is not None and norm.bias is not None
            and recompute_applies(x, norm.weight, norm.bias, weight, bias)):
        return _LayerNormLinear.apply(x, norm.weight, norm.bias, norm.eps, weight, bias)
    return F.linear(norm(x), weight, bias)


def window_softmax(logits: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, b: int) -> torch.Tensor:
    """``softmax(logits + pos + mask)`` over the last dim: ``logits`` ``(B*nW, heads, N, N)``, the position bias
    ``pos`` ``(1, heads, N, N)`` and the shift mask ``mask`` ``(nW, N, N)`` (or None) shared by the ``b`` images,
    broadcast by views (mmdet's and the official order: the bias first, then the mask).

    ``logits`` must be a fresh product that nothing else reads (the callers' ``q k^T``; autograd keeps a product's
    inputs, not its output): the bias and the mask are added into it in place, the same additions in the same order,
    and where autograd records nothing (the recomputing attention's forward and backward) the softmax overwrites it
    too (a row's maximum and sum are taken before any of its entries is written): no further ``(B*nW, heads, N, N)``
    map (31 MB per block at Swin-T's stage 1, 512x768, batch 2). Under autocast a bf16 / fp16 sum is taken out of
    place in fp32 instead."""
    bw, heads, n, _ = logits.shape
    summed = logits.view(b, bw // b, heads, n, n)
    wide = torch.promote_types(summed.dtype, pos.dtype)
    if wide in REDUCED_DTYPES and autocast_dtype(logits.device.type) is not None:
        wide = torch.float32
    if summed.dtype == wide:
        summed.add_(pos)
    else:  # autocast: a bf16 product plus the bias, summed (and normalised) in fp32 as the references do
        summed = summed.to(wide).add_(pos)
        logits = summed.view(bw, heads, n, n)
    if mask is not None:
        summed.add_(mask.unsqueeze(1))
    if (torch.is_grad_enabled() and (logits.requires_grad or pos.requires_grad)) or not logits.is_contiguous():
        return logits.softmax(-1)  # autograd keeps the probabilities for its backward
    return torch.ops.aten._softmax.out(logits, -1, False, out=logits)


class _WindowAttention(torch.autograd.Function):
    """``softmax(scale * q k^T + pos + mask) v`` saving ``scale * q``, ``k`` and ``v`` (contiguous: the layout the
    batched products read) and the position bias, not the probabilities: the backward recomputes them with the
    forward's own ops (one ``(N, N)`` product and softmax per window and head). The shift mask is the stage's shared
    buffer, so keeping it costs nothing.

    Given ``packed``, the ``(3, B*nW, heads, N, d)`` tensor whose three slices are q, k and v, the function takes it
    in their place and writes its gradient as one tensor: the three products of the backward land in its slices, where
    separate gradients would be stacked into a fourth buffer (Swin-T's first stage at 512x768, batch 2: a 56 MB map
    written once more per block, and held beside the three at the peak)."""

    @staticmethod
    def forward(ctx, packed, q, k, v, pos, mask, b, scale):
        if packed is not None:
            q, k, v = packed.unbind(0)
        qs, k, v = (q * scale).contiguous(), k.contiguous(), v.contiguous()
        probs = window_softmax(torch.matmul(qs, k.transpose(-2, -1)), pos, mask, b)
        ctx.save_for_backward(qs, k, v, pos, mask)
        ctx.b, ctx.scale, ctx.packed = b, scale, packed is not None
        return torch.matmul(probs, v)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        qs, k, v, pos, mask = ctx.saved_tensors
        b, scale = ctx.b, ctx.scale
        # the output's gradient arrives as a view of the merged heads' gradient: two products read it, and each would
        # copy it into a contiguous batch of its own
        grad = grad.contiguous()
        packed = grad.new_empty((3, *qs.shape)) if ctx.packed else None
        out_q, out_k, out_v = (None, None, None) if packed is None else packed.unbind(0)  # None: fresh tensors
        probs = window_softmax(torch.matmul(qs, k.transpose(-2, -1)), pos, mask, b)
        d_v = torch.matmul(probs.transpose(-2, -1), grad, out=out_v)
        d_logits = torch.matmul(grad, v.transpose(-2, -1))  # d probs, overwritten by d logits (row by row, as above)
        torch.ops.aten._softmax_backward_data.out(d_logits, probs, -1, probs.dtype, grad_input=d_logits)
        del probs
        d_pos = d_logits.sum_to_size(pos.shape) if ctx.needs_input_grad[4] else None
        d_q = torch.matmul(d_logits, k, out=out_q).mul_(scale)
        d_k = torch.matmul(d_logits.transpose(-2, -1), qs, out=out_k)
        if packed is not None:
            return packed, None, None, None, d_pos, None, None, None
        return None, d_q, d_k, d_v, d_pos, None, None, None


class _KernelWindowAttention(torch.autograd.Function):
    """:class:`_WindowAttention` in the plugin's C kernels (fp32): the forward is the inference kernel
    (:func:`mmplugin.ops.window_attention.window_attention`, reading q, k, v in the projection's layout), the backward
    recomputes the probabilities and computes the five products, the softmax gradient and the position bias's gradient
    per window in the thread's cache (:func:`mmplugin.ops.window_attention.window_attention_grad`), writing the
    gradient in the projection's layout. Saved: the ``(B*nW, N, 3C)`` projection the ``packed`` view shows, and the
    bias. Returns ``(B*nW, N, heads * d)``."""

    @staticmethod
    def forward(ctx, packed, pos, mask, b, scale):
        q, k, v = packed.unbind(0)
        out = window_attention(q, k, v, pos, mask, scale)
        ctx.save_for_backward(packed, pos, mask)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        packed, pos, mask = ctx.saved_tensors
        _, bw, heads, n, d = packed.shape
        qkv = packed.permute(1, 3, 0, 2, 4).reshape(bw, n, 3 * heads * d)  # a view (:func:`_kernel_applies`)
        dqkv, dpos = window_attention_grad(qkv, grad, pos, mask, heads, ctx.scale)
        d_pos = dpos.view(pos.shape).to(pos.dtype) if ctx.needs_input_grad[1] else None
        return dqkv.view(bw, n, 3, heads, d).permute(2, 0, 3, 1, 4), d_pos, None, None, None


class _KernelMapAttention(torch.autograd.Function):
    """:class:`_KernelWindowAttention` on the map's layout (:func:`mmplugin.ops.window_attention.map_window_attention`
    and its gradient): q, k, v projected on the map's real tokens and read through the window rows, the output and
    the gradient written to the map's rows, the padding tokens' gradient summed into the zero token's projection
    ``pad``. No window partition, reverse or their adjoints. Swin V2's cosine attention passes its per-head logit
    scale ``cosine`` (it takes a gradient); V1 passes None. Returns ``(B, L, C)``."""

    @staticmethod
    def forward(ctx, qkv, pad, pos, rows, mask, heads, scale, cosine):
        ctx.save_for_backward(qkv, pad, pos, rows, mask, cosine)
        ctx.heads, ctx.scale = heads, scale
        up = torch.float32 if cosine is not None else qkv.dtype  # V2: the fp32 arithmetic its gradient differentiates
        return map_window_attention(qkv.to(up), pad.to(qkv.dtype).to(up), rows, heads, pos, mask, scale,
                                    cosine).to(qkv.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        qkv, pad, pos, rows, mask, cos = ctx.saved_tensors
        dqkv, dpos, dpad, *dcos = map_window_attention_grad(qkv, grad, pad, rows, ctx.heads, pos, mask, ctx.scale, cos)
        need = ctx.needs_input_grad
        return (dqkv, dpad.to(pad.dtype) if need[1] else None, dpos.view(pos.shape).to(pos.dtype) if need[2] else None,
                None, None, None, None, dcos[0].view(cos.shape).to(cos.dtype) if cos is not None and need[7] else None)


def map_window_softmax_attention(qkv: torch.Tensor, pad: torch.Tensor, rows: torch.Tensor, heads: int,
                                 pos: torch.Tensor, mask: torch.Tensor | None, scale: float,
                                 cosine: torch.Tensor | None = None) -> torch.Tensor | None:
    """``softmax(scale * q k^T + pos + mask) v`` over the windows of a map, for CPU training (fp32, or the bf16
    projection of bf16 autocast: :func:`map_attention_dtype`), in the plugin's kernels (:class:`_KernelMapAttention`),
    or None where they do not apply (the caller partitions the map and runs :func:`window_softmax_attention`).

    Args:
        qkv: ``(B, L, 3C)`` the projection of the map's ``L`` tokens. pad: ``(3C,)`` a zero token's projection.
        rows: ``(nW, N)`` each window token's map row (-1: padding), :meth:`WindowGeometry.map_rows`.
        heads, pos, mask, scale: as :func:`window_softmax_attention` (``pos`` ``(1, heads, N, N)``).
        cosine: Swin V2's ``heads`` fp32 logit scales or None: scores ``scale * cosine[h] * cos(q, k) + pos + mask``.

    Returns ``(B, L, C)``."""
    if not (qkv.dtype == pad.dtype and qkv.dtype in (torch.float32, torch.bfloat16) and pos.dtype == torch.float32
            and (mask is None or mask.is_floating_point())  # the mask's 0 and -100: exact in any float type
            and (cosine is None or (cosine.dtype == torch.float32 and cosine.numel() == heads))
            and qkv.dim() == 3 and qkv.is_contiguous() and _eager_cpu_training(qkv, (pad, pos, cosine))
            and kernel_context(qkv, pad, pos, rows, mask, cosine)):
        return None
    return _KernelMapAttention.apply(qkv, pad, pos, rows, mask, heads, scale, cosine)


def _kernel_applies(packed: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether :class:`_KernelWindowAttention` serves this fp32 attention: ``packed`` a view of a contiguous
    ``(B*nW, N, 3, heads, d)`` projection (the backward reads and writes that layout), an fp32 bias and mask, and
    the kernels built."""
    return (packed.dtype == pos.dtype == torch.float32 and (mask is None or mask.dtype == torch.float32)
            and packed.permute(1, 3, 0, 2, 4).is_contiguous() and kernel_context(packed, pos, mask))


def kernel_context(*tensors: torch.Tensor | None) -> bool:
    """The kernels can run on ``tensors`` here: built, an eager context (no trace, export, compile or Python dispatch
    mode such as ``FlopCounterMode`` or fake tensors) and real CPU memory (:mod:`mmplugin.ops.eligible`)."""
    return eager_context() and all(plain_cpu(t) for t in tensors) and kernel_available()


def window_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                             mask: torch.Tensor | None, b: int, scale: float,
                             packed: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(scale * q k^T + pos + mask) v``: ``q, k, v`` ``(B*nW, heads, N, d)`` -> ``(B*nW, heads, N, d)``,
    with the ``(1, heads, N, N)`` position bias ``pos`` and the ``(nW, N, N)`` shift mask (or None) shared by the
    ``b`` images. Keeps no probabilities for the backward where :func:`recompute_applies`; autograd's ops
    elsewhere. The mask takes no gradient.

    ``packed``: the ``(3, B*nW, heads, N, d)`` tensor that ``q, k, v`` are the slices of (e.g. the projection's
    output split into heads), if there is one: its gradient is then written as one tensor (see ``_WindowAttention``).
    """
    if packed is not None and not (packed.shape[0] == 3 and packed[0].shape == q.shape):
        raise ValueError(f'packed must be the (3, *q.shape) stack of q, k, v; got {tuple(packed.shape)} for q of '
                         f'shape {tuple(q.shape)}')
    if recompute_applies(q, k, v, pos):
        if packed is not None:
            if not all(t.data_ptr() == s.data_ptr() and t.stride() == s.stride() and t.shape == s.shape
                       for t, s in zip((q, k, v), packed)):
                # the function computes from ``packed`` alone: q, k, v held elsewhere would be ignored
                raise ValueError('packed must be the tensor that q, k, v are the slices of (same memory), not a copy')
            if _kernel_applies(packed, pos, mask):
                bw, heads, n, d = q.shape
                out = _KernelWindowAttention.apply(packed, pos, mask, b, scale)  # (B*nW, N, heads * d)
                return out.view(bw, n, heads, d).transpose(1, 2)
            return _WindowAttention.apply(packed, None, None, None, pos, mask, b, scale)
        return _WindowAttention.apply(None, q, k, v, pos, mask, b, scale)
    return torch.matmul(window_softmax(torch.matmul(q * scale, k.transpose(-2, -1)), pos, mask, b), v)
