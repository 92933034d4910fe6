"""Folding BatchNorm (in eval mode) and per-channel scales into the convolutions or linears next to them.

``BN(conv(x)) == conv'(x)`` with ``w' = w * s`` and ``b' = (b - mean) * s + beta`` where
``s = gamma / sqrt(var + eps)``; likewise ``conv(BN(x))`` for a 1x1 convolution. These are exact algebraic
rewrites (differences are float rounding, ~1e-7 relative), used both on the fly in eval mode and permanently by
``switch_to_deploy()``.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmplugin.models.layers.gemm import onednn_ops_available, train_linear, trains_on_onednn
from mmplugin.models.layers.prepack import prepacked


def bn_scale_shift(bn: _BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, t)`` with ``bn(x) == x * s + t`` per channel, from the running statistics. Shapes ``(C,)``."""
    var = bn.running_var
    s = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        s = s * bn.weight
    t = -bn.running_mean * s
    if bn.bias is not None:
        t = t + bn.bias
    return s, t


def uses_running_stats(norm: nn.Module) -> bool:
    """True when ``norm`` is a BatchNorm that normalises with its running statistics (foldable)."""
    return isinstance(norm, _BatchNorm) and not norm.training and norm.running_var is not None


def folded_conv_bn(conv: nn.Conv2d, bn: _BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of ``conv`` with the following eval-mode ``bn`` folded in."""
    s, t = bn_scale_shift(bn)
    w = conv.weight * s.view(-1, 1, 1, 1)
    b = t if conv.bias is None else conv.bias * s + t
    return w, b


def conv_bn(x: torch.Tensor, conv: nn.Conv2d, bn: nn.Module, act: str | None = None) -> torch.Tensor:
    """``act(bn(conv(x)))`` (``act`` in {None, 'relu', 'gelu'}), as one convolution when ``bn`` uses running
    statistics or was folded away (``nn.Identity``), fused with the activation where oneDNN allows."""
    if uses_running_stats(bn) or isinstance(bn, nn.Identity):
        w, b = folded_conv_bn(conv, bn) if uses_running_stats(bn) else (conv.weight, conv.bias)
        if act is not None:
            return conv_act(x, conv, act, w, b)
        return F.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)
    y = bn(conv(x))
    return _act(y, act)


def _act(y: torch.Tensor, act: str | None) -> torch.Tensor:
    if act is None:
        return y
    return F.relu(y) if act == 'relu' else F.gelu(y)


def folded_bn_conv1x1(bn: _BatchNorm, conv: nn.Conv2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of a 1x1 ``conv`` with the preceding eval-mode ``bn`` folded in."""
    s, t = bn_scale_shift(bn)
    b = conv.weight.flatten(1) @ t
    if conv.bias is not None:
        b = b + conv.bias
    return conv.weight * s.view(1, -1, 1, 1), b


@torch.no_grad()
def fuse_conv_bn(conv: nn.Conv2d, bn: _BatchNorm) -> nn.Conv2d:
    """Return a new conv equal to ``bn(conv(.))`` in eval mode (for deployment)."""
    w, b = folded_conv_bn(conv, bn)
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                      conv.dilation, conv.groups, bias=True).to(w)
    fused.weight.copy_(w)
    fused.bias.copy_(b)
    return fused


@torch.no_grad()
def fuse_bn_conv1x1(bn: _BatchNorm, conv: nn.Conv2d) -> nn.Conv2d:
    """Return a new 1x1 conv equal to ``conv(bn(.))`` in eval mode (for deployment)."""
    w, b = folded_bn_conv1x1(bn, conv)
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, 1, bias=True).to(w)
    fused.weight.copy_(w)
    fused.bias.copy_(b)
    return fused


@torch.no_grad()
def scale_output_(layer: nn.Conv2d | nn.Linear, scale: torch.Tensor) -> None:
    """Multiply the outputs of ``layer`` by the per-channel ``scale`` (any shape with C elements), in place."""
    s = scale.reshape(-1)
    layer.weight.mul_(s.view(-1, *([1] * (layer.weight.ndim - 1))))
    if layer.bias is not None:
        layer.bias.mul_(s)


_ONEDNN = onednn_ops_available('_convolution_pointwise')
_FUSION_OFF = 0  # > 0 inside ``onednn_fusion_disabled()``


@contextmanager
def onednn_fusion_disabled():
    """Run standard ops only. oneDNN's fused ReLU / GELU post-ops map NaN to 0, so a forward whose input holds
    NaN / Inf must not use them (NaN in, NaN out)."""
    global _FUSION_OFF
    _FUSION_OFF += 1
    try:
        yield
    finally:
        _FUSION_OFF -= 1


def all_finite(x: torch.Tensor) -> bool:
    """Every value of ``x`` is finite (no NaN, no +-Inf), as ``torch.isfinite(x).all()`` says, mostly in one pass.

    A sum is finite only if each term is (NaN and Inf propagate through every addition), so a finite sum of ``x``
    (accumulated in fp32, in float64 for float64) settles it; a non-finite sum, which finite values can also reach
    by overflowing, is decided element by element. A 1x3x800x1216 fp32 image on 2 cores of an AMD EPYC family 25
    model 17: 0.08 ms, against 4.4 ms for ``isfinite`` (a bool map, then its reduction)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return bool(torch.isfinite(x.sum(dtype=acc))) or bool(torch.isfinite(x).all())


def fused_dtype(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.dtype | None:
    """The dtype in which oneDNN's fused ops compute ``x`` against ``weight``, or None where they do not apply.

    They apply at inference on a CPU (no autograd: none of ``x``, ``weight``, ``bias`` needs a gradient; the oneDNN ops
    have no backward, so a trained bias alone, as in bias-only fine-tuning, keeps the standard ops), not traced /
    exported / compiled (those graphs keep standard ops: the oneDNN ops have no fake-tensor kernel; inductor fuses on
    its own), in:

    - fp32: ``x`` and ``weight`` fp32, outside autocast;
    - bf16: under CPU bf16 autocast (``x`` fp32 or bf16, ``weight`` fp32 or bf16: the operands are cast as autocast
      casts them for ``F.linear`` / ``F.conv2d``, and the result is bf16 like theirs), or a bf16 model (``x`` and
      ``weight`` bf16) -- where oneDNN has bf16 kernels (AVX-512 and newer). The fused ops are not on autocast's
      lists: without this dtype they would run a bf16-autocast forward's GEMMs in fp32.

    Anything else (fp16, bf16 without oneDNN bf16 kernels, float64) runs standard ops, under autocast as usual.
    """
    if (torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling()
            or torch.onnx.is_in_onnx_export() or _FUSION_OFF):
        return None
    needs_grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if not _ONEDNN or x.device.type != 'cpu' or (torch.is_grad_enabled() and needs_grad):
        return None
    if torch.is_autocast_enabled('cpu'):
        ok = (torch.get_autocast_dtype('cpu') == torch.bfloat16 and _onednn_bf16()
              and x.dtype in _AUTOCAST_IN and weight.dtype in _AUTOCAST_IN)
        return torch.bfloat16 if ok else None
    if x.dtype == weight.dtype == torch.float32:
        return torch.float32
    return torch.bfloat16 if x.dtype == weight.dtype == torch.bfloat16 and _onednn_bf16() else None


_AUTOCAST_IN = (torch.float32, torch.bfloat16)


@lru_cache(maxsize=None)
def _onednn_bf16() -> bool:
    """oneDNN has bf16 kernels on this CPU (AVX-512 and newer; native with AVX512-BF16 / AMX). Fixed for the
    process: the kernel family caps (``ONEDNN_MAX_CPU_ISA``) are read when oneDNN starts."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def can_fuse_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """oneDNN post-op fusion applies to ``x`` against ``weight`` (:func:`fused_dtype` names the dtype)."""
    return fused_dtype(x, weight) is not None


def _operands(dtype: torch.dtype, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None):
    """``x``, ``w`` and ``b`` in ``dtype`` (casts only under autocast; no copy where they already are)."""
    return x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)


def _linear_operands(dtype: torch.dtype, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None):
    """:func:`_operands` for oneDNN's linear: a frozen weight's packed copy in ``dtype`` where there is one
    (:mod:`mmplugin.models.layers.prepack`), else the weight itself, cast (a 1x1 convolution's ``(N, K, 1, 1)``
    weight as its ``(N, K)`` matrix)."""
    packed = prepacked(w, dtype)  # already in ``dtype``: ``.to`` hands it back as it is
    if packed is None and w.dim() == 4:
        w = w.reshape(w.shape[0], w.shape[1])
    return _operands(dtype, x, w if packed is None else packed, b)


def add_residual(out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``out + residual``, in place into ``out`` where that keeps the promoted dtype; otherwise out of place, as
    the reference formulations' ``x + f(x)``: under autocast ``out`` is bf16 / fp16 while the residual stream stays
    fp32, and an in-place add would round the stream to the lower precision at every block."""
    return out.add_(residual) if out.dtype == torch.promote_types(out.dtype, residual.dtype) else residual + out


def conv_act(x: torch.Tensor, conv: nn.Conv2d, act: str, weight: torch.Tensor | None = None,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """``act(conv(x))`` with ``act`` in {'relu', 'gelu'} (exact erf GELU), one oneDNN kernel when possible (a dense
    1x1 convolution with GELU on a channels_last map: oneDNN's linear over the pixels, :func:`_tokens`).

    ``weight`` / ``bias`` replace the conv's own (e.g. with a BatchNorm folded in); geometry comes from ``conv``.
    """
    w = conv.weight if weight is None else weight
    b = conv.bias if weight is None else bias
    dtype = fused_dtype(x, w, b)
    if dtype is not None:
        tokens = _tokens(x, conv, w) if act == 'gelu' else None
        if tokens is not None:  # a 1x1 convolution on a channels_last map: oneDNN's linear over its pixels
            out = torch.ops.mkldnn._linear_pointwise(*_linear_operands(dtype, tokens, w, b), 'gelu', [], 'none')
            return out.permute(0, 3, 1, 2)
        x, w, b = _operands(dtype, x, w, b)
        return torch.ops.mkldnn._convolution_pointwise(x, w, b, list(conv.padding), list(conv.stride),
                                                       list(conv.dilation), conv.groups, act, [],
                                                       'none' if act == 'gelu' else None)
    return _act(F.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups), act)


def plain_1x1(conv: nn.Conv2d) -> bool:
    """``conv`` is a dense 1x1 convolution with ``F.conv2d``'s defaults otherwise (stride 1, no padding or
    dilation, one group): a linear over the pixels."""
    return (tuple(conv.kernel_size) == (1, 1) and conv.groups == 1 and tuple(conv.stride) == (1, 1)
            and tuple(conv.dilation) == (1, 1) and conv.padding in ((0, 0), 'valid'))


def _tokens(x: torch.Tensor, conv: nn.Conv2d, w: torch.Tensor) -> torch.Tensor | None:
    """``x`` ``(B, C, H, W)`` as the ``(B, H, W, C)`` view of its memory where ``conv`` (weight ``w``) is a dense 1x1
    convolution (stride 1, no padding, one group) and ``x`` is a channels_last map: the convolution is then a linear
    over the pixels, which runs on oneDNN's linear and takes a prepacked weight (:mod:`.prepack`); None otherwise."""
    if (x.dim() == 4 and w.dim() == 4 and tuple(w.shape[2:]) == (1, 1) and plain_1x1(conv)
            and x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] == w.shape[1]
            and x.stride(1) == 1):  # channels innermost (with one channel both layouts pass the check above)
        return x.permute(0, 2, 3, 1)
    return None


def conv_add(x: torch.Tensor, conv: nn.Conv2d, residual: torch.Tensor, weight: torch.Tensor | None = None,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """``conv(x) + residual`` (optionally with replacement ``weight`` / ``bias``), one oneDNN kernel when possible.
    The sum keeps the promoted dtype (:func:`add_residual`): an fp32 ``residual`` stays fp32 under autocast."""
    w = conv.weight if weight is None else weight
    b = conv.bias if weight is None else bias
    dtype = fused_dtype(x, w, b)
    if dtype is not None and not residual.requires_grad:
        tokens = _tokens(x, conv, w)
        if (tokens is not None and residual.shape == (x.shape[0], w.shape[0], *x.shape[2:])
                and residual.is_contiguous(memory_format=torch.channels_last)):
            # a 1x1 convolution on channels_last maps: oneDNN's linear over the pixels, the residual added in its tile
            x, w, b = _linear_operands(dtype, tokens, w, b)
            rows = residual.permute(0, 2, 3, 1)
            if residual.dtype == dtype:
                return torch.ops.mkldnn._linear_pointwise.binary(x, rows, w, b, 'add').permute(0, 3, 1, 2)
            out = torch.ops.mkldnn._linear_pointwise(x, w, b, 'none', [], '').permute(0, 3, 1, 2)
            return add_residual(out, residual)
        x, w, b = _operands(dtype, x, w, b)
        if residual.dtype == dtype:
            return torch.ops.mkldnn._convolution_pointwise.binary(x, residual, w, b, list(conv.padding),
                                                                  list(conv.stride), list(conv.dilation),
                                                                  conv.groups, 'add', None, None, [], None)
        out = torch.ops.mkldnn._convolution_pointwise(x, w, b, list(conv.padding), list(conv.stride),
                                                      list(conv.dilation), conv.groups, 'none', [], None)
        return add_residual(out, residual)
    return add_residual(F.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups), residual)


def _calls_module(x: torch.Tensor, layer: nn.Linear, w: torch.Tensor, b: torch.Tensor | None, own: bool) -> bool:
    """Where no fused op applies, whether the standard path is the module call ``layer(x)`` itself, so that what
    sees modules sees this one (its forward hooks; exported graphs name it, which PT2E int8's ``keep_float`` by module
    name or type needs): for its own weights (``own``), a plain ``nn.Linear`` forward (a subclass's own forward may
    call these functions itself, or compute something else than on the fused path), no parametrization (its weight
    would be computed once more), and not where fp32 CPU autograd runs oneDNN's training GEMM
    (:func:`train_linear`). The fused and training paths call no module, so hooks do not fire there."""
    return (own and type(layer).forward is nn.Linear.forward and not torch.nn.utils.parametrize.is_parametrized(layer)
            and not trains_on_onednn(x, w, b))


def linear(x: torch.Tensor, layer: nn.Linear, weight: torch.Tensor | None = None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``layer(x)`` (or with replacement ``weight`` / ``bias``) on ``(..., K)`` tensors, through oneDNN's linear at
    inference when possible: the bias is added in the GEMM's output tile, whereas ``F.linear``'s ``addmm`` first
    copies the broadcast bias into the whole ``(..., N)`` output (Swin-T at 800x1216: 130 ms of copies per forward on
    2 cores, AMD EPYC family 25)."""
    w = layer.weight if weight is None else weight
    b = layer.bias if weight is None else bias
    dtype = fused_dtype(x, w, b)
    if dtype is not None:
        return torch.ops.mkldnn._linear_pointwise(*_linear_operands(dtype, x, w, b), 'none', [], '')
    return layer(x) if _calls_module(x, layer, w, b, weight is None) else train_linear(x, w, b)


def linear_act(x: torch.Tensor, linear: nn.Linear, act: str) -> torch.Tensor:
    """``act(linear(x))`` with ``act`` in {'relu', 'gelu'} (exact erf GELU) on ``(..., K)`` tensors, one oneDNN
    kernel when possible: the activation is applied to the GEMM's output tile while it is in cache, instead of a
    second pass over the ``(..., N)`` result (Swin's MLP: 4C channels at every position). Only GELU is fused:
    oneDNN's ReLU post-op maps NaN to 0 (its GELU keeps NaN; tests/models/test_fusion.py), so ReLU runs as its own op
    and NaN in gives NaN out."""
    w, b = linear.weight, linear.bias
    dtype = fused_dtype(x, w, b) if act == 'gelu' else None
    if dtype is not None:
        return torch.ops.mkldnn._linear_pointwise(*_linear_operands(dtype, x, w, b), 'gelu', [], 'none')
    return _act(linear(x) if _calls_module(x, linear, w, b, True) else train_linear(x, w, b), act)


def linear_add(x: torch.Tensor, linear: nn.Linear, residual: torch.Tensor) -> torch.Tensor:
    """``linear(x) + residual`` on ``(..., K)`` / ``(..., N)`` tensors, one oneDNN kernel when possible (the residual
    is read into the GEMM's output tile instead of a second pass over both maps). The sum keeps the promoted dtype
    (:func:`add_residual`): under autocast the GEMM runs in bf16 and an fp32 residual stream stays fp32. After a module
    call the sum is a new tensor: the module's output may be held by its hooks (a forward hook keeping it, a full
    backward hook's view), which an in-place add would change or autograd refuse."""
    w, b = linear.weight, linear.bias
    dtype = fused_dtype(x, w, b)
    if dtype is not None and not residual.requires_grad:
        x, w, b = _linear_operands(dtype, x, w, b)
        if residual.dtype == dtype:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, w, b, 'add')
        return add_residual(torch.ops.mkldnn._linear_pointwise(x, w, b, 'none', [], ''), residual)
    if _calls_module(x, linear, w, b, True):
        return residual + linear(x)
    return add_residual(train_linear(x, w, b), residual)
