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
no autocast, not traced or compiled) to a 1x1 convolution with stride 1, no padding and one group; elsewhere the
plain ops run. The forward is the plain ops' bit for bit; the backward differs by the GELU kernel's erf (a few fp32
ulps) where it runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mmplugin.models.layers.recompute import recompute_applies
from mmplugin.ops.gelu import applies as gelu_kernel_applies
from mmplugin.ops.gelu import gelu_grad

__all__ = ['gelu_conv1x1']


def _pixels(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` ``(B, C, H, W)`` as a contiguous view of its memory (channels_last: ``(B, H, W, C)``), or None."""
    if t.is_contiguous():
        return t
    if t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1)
    return None


def _gelu_and_grad(h: torch.Tensor, d_a: torch.Tensor, act: bool) -> torch.Tensor | None:
    """GELU's gradient into ``d_a`` in place (``d_a * GELU'(h)``) and, with ``act``, ``GELU(h)`` in ``h``'s layout,
    from one pass of the kernel; returns ``GELU(h)`` or None. Raises nothing: the caller checked the layouts."""
    hv, gv = _pixels(h), _pixels(d_a)
    _, a = gelu_grad(hv, gv, act=act, out=gv)
    if a is None:
        return None
    return a if a.shape == h.shape else a.permute(0, 3, 1, 2)


def _same_layout(h: torch.Tensor, d_a: torch.Tensor) -> bool:
    """The kernel can run on the two maps' memory as they are: one contiguous layout, the same strides."""
    hv, gv = _pixels(h), _pixels(d_a)
    return hv is not None and gv is not None and hv.stride() == gv.stride() and gelu_kernel_applies(hv)


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
            if _same_layout(h, d_h):
                act = _gelu_and_grad(h, d_h, need[1])
            else:
                act = F.gelu(h) if need[1] else None
                torch.ops.aten.gelu_backward.grad_input(d_h, h, grad_input=d_h)  # elementwise: in place is exact
        d_w = d_b = None
        if need[1] or (need[2] and ctx.has_bias):
            act = F.gelu(h) if act is None else act
            mask = [False, bool(need[1]), bool(need[2] and ctx.has_bias)]
            _, d_w, d_b = torch.ops.aten.convolution_backward(grad, act, weight, bias_sizes, *geometry, mask)
        return d_h, d_w, d_b


def gelu_conv1x1(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.conv2d(F.gelu(h), weight, bias)`` (exact erf GELU) for a 1x1 convolution weight ``(N, K, 1, 1)`` on
    ``h`` ``(B, K, H, W)`` -> ``(B, N, H, W)``, keeping only ``h`` for the backward where
    :func:`~mmplugin.models.layers.recompute.recompute_applies`; the plain ops elsewhere."""
    if weight.dim() == 4 and tuple(weight.shape[2:]) == (1, 1) and recompute_applies(h, weight, bias):
        return _GeluConv1x1.apply(h, weight, bias)
    return F.conv2d(F.gelu(h), weight, bias)
