"""The convolutional MLP's training op that keeps less for the backward: ``conv1x1(GELU(h))`` saving ``h`` only, the
counterpart of :func:`mmplugin.models.layers.recompute.gelu_linear` for SwiftFormer's pointwise convolutions.

Why: autograd keeps a ConvEncoder's or ConvMlp's hidden map twice (``h = fc1(y)`` for GELU's gradient and
``GELU(h)`` for fc2's weight gradient: 8C values per pixel at the usual ratio of 4), and SwiftFormer's widest
tensors are these maps. Here the backward computes fc2's input gradient first, then GELU's gradient in place on it
with ``GELU(h)`` from the same pass (:func:`mmplugin.ops.gelu.gelu_grad`: one read of ``h``, erf computed once),
then fc2's weight and bias gradients from that ``GELU(h)``; PyTorch's ``gelu_backward`` reads ``h`` again and
computes erf again. The convolutions are the same calls autograd makes (``aten.convolution_backward``, its input and
weight parts asked for separately), so they run on the same kernels.

Applies as :func:`mmplugin.models.layers.recompute.recompute_applies` says (eager CPU training in float32 / float64,
no autocast, not traced or compiled) to a ``(N, K, 1, 1)`` weight; elsewhere the plain ops run. It computes
``F.conv2d`` with its defaults (stride 1, no padding, one group): callers hand it only such convolutions. The
forward is the plain ops' bit for bit; the backward differs by the GELU kernel's erf (a few fp32 ulps) where it
runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mmplugin.models.layers.recompute import recompute_applies
from mmplugin.ops.gelu import applies as gelu_kernel_applies
from mmplugin.ops.gelu import gelu_grad

__all__ = ['gelu_conv1x1']


def _pixels(t: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """``t`` ``(B, C, H, W)`` as a contiguous view of its memory and whether that view is permuted (channels_last:
    ``(B, H, W, C)``), or None where neither layout is contiguous. NCHW is tried first: where both layouts are
    contiguous (C, H and W such that the strides coincide, e.g. one of them 1) the memory order is the same."""
    if t.is_contiguous():
        return t, False
    if t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1), True
    return None


def _kernel_gelu(h: torch.Tensor, d_a: torch.Tensor, act: bool) -> tuple[bool, torch.Tensor | None]:
    """GELU's gradient into ``d_a`` in place (``d_a * GELU'(h)``) and, with ``act``, ``GELU(h)`` in ``h``'s layout,
    from one pass of the kernel over the two maps' memory. The element-by-element pairing needs the same memory
    order for both: the same strides (shapes alike, so a (B, C, H, W) map with C == H == W cannot be taken for its
    channels_last twin). Returns ``(ran, GELU(h) or None)``; ``ran`` False leaves ``d_a`` untouched."""
    hv, gv = _pixels(h), _pixels(d_a)
    if hv is None or gv is None or h.stride() != d_a.stride() or not gelu_kernel_applies(hv[0]):
        return False, None
    out = gelu_grad(hv[0], gv[0], act=act, out=gv[0])
    if out is None:
        return False, None
    a = out[1]
    return True, None if a is None else (a.permute(0, 3, 1, 2) if hv[1] else a)


class _GeluConv1x1(torch.autograd.Function):
    """``F.conv2d(GELU(h), weight, bias)`` for a 1x1 ``weight`` ``(N, K, 1, 1)`` on ``h`` ``(B, K, H, W)``, saving
    ``h`` (not ``GELU(h)``); see the module docstring."""

    @staticmethod
    def forward(ctx, h, weight, bias):
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        return F.conv2d(F.gelu(h), weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        bias_sizes = [weight.shape[0]] if ctx.has_bias else None
        # stride, padding, dilation, transposed, output padding, groups of a plain 1x1 convolution
        geometry = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        d_h = act = None
        if need[0]:  # fc2's input gradient (its values do not depend on the input: h stands in for GELU(h))
            d_h = torch.ops.aten.convolution_backward(grad, h, weight, bias_sizes, *geometry, [True, False, False])[0]
            ran, act = _kernel_gelu(h, d_h, bool(need[1]))
            if not ran:
                act = F.gelu(h) if need[1] else None
                torch.ops.aten.gelu_backward.grad_input(d_h, h, grad_input=d_h)  # elementwise: in place is exact
        d_w = d_b = None
        if need[1]:
            act = F.gelu(h) if act is None else act
            mask = [False, True, bool(need[2] and ctx.has_bias)]
            _, d_w, d_b = torch.ops.aten.convolution_backward(grad, act, weight, bias_sizes, *geometry, mask)
        elif need[2] and ctx.has_bias:  # the bias alone: the output gradient summed, no GELU(h) needed
            d_b = grad.sum((0, 2, 3))
        return d_h, d_w, d_b


def gelu_conv1x1(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.conv2d(F.gelu(h), weight, bias)`` (exact erf GELU) for a 1x1 convolution weight ``(N, K, 1, 1)`` on
    ``h`` ``(B, K, H, W)`` -> ``(B, N, H, W)``, keeping only ``h`` for the backward where
    :func:`~mmplugin.models.layers.recompute.recompute_applies`; the plain ops elsewhere."""
    if weight.dim() == 4 and tuple(weight.shape[2:]) == (1, 1) and recompute_applies(h, weight, bias):
        return _GeluConv1x1.apply(h, weight, bias)
    return F.conv2d(F.gelu(h), weight, bias)
