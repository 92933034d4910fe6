"""LayerNorm of a bf16 or fp16 map with fp32 parameters in CPU training, with its weight and bias gradients summed in
fp32; of a bf16 map at inference, faster; and Swin V2's post-norm ``residual + norm(x)`` at inference in one pass
(fp32 or bf16, :func:`add_layer_norm`).

Why: under CPU autocast a LayerNorm keeps its input's dtype, so a reduced-precision map (Swin's residual stream under
bf16 autocast) meets PyTorch's mixed-type LayerNorm, whose CPU backward sums the weight and bias gradients over the
rows in the input's precision. The sums stop growing once they are a few hundred (bf16) or a few thousand (fp16)
times one row's term. Measured with torch 2.13.0+cpu on 49,152 rows of 96 channels (Swin-T's stage 1 at 512x768,
batch 2), against float64:
- bf16: a bias gradient entry of 2128 against 24675, the weight gradient off by 16% of its largest entry;
- fp16: 16132 against 24650, and 3.6%.
The forward and the input gradient are computed in fp32 there and are not affected.

Here, in eager CPU autograd (training):
- bf16 runs :mod:`mmplugin.ops.layer_norm`: fp32 sums throughout, one rounding of the results to bf16, and faster
  (2 threads of an Intel Xeon family 6 model 167, that stage-1 map: backward 1.4 against 4.0 ms, forward 1.6 against
  2.0 ms);
- fp16, and bf16 where no kernel is built, run PyTorch's fp32 LayerNorm on the widened map, its output rounded back:
  the same forward values, fp32 gradients, two more casts.
At inference (no autograd), a bf16 map runs the same kernel's forward: PyTorch's formula computed in fp32 and rounded
once, as its mixed-type LayerNorm does, up to the fp32 summation order, and faster (that stage-1 map at 800x1216,
batch 1: 1.1 against 2.4 ms); fp16 keeps ``norm(x)`` there. fp32, other devices, tracing, export, compiling and
``torch.func`` transforms keep ``norm(x)`` (fp32 at inference takes the kernel only for :func:`add_layer_norm`'s
fused residual); so do modules with forward or backward hooks, which only a module call runs. The fp16 path keeps the
fp32 normalised map for its backward (twice the bytes of the fp16 one).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from mmplugin.ops import layer_norm as kernel
from mmplugin.ops.eligible import eager_context

__all__ = ['layer_norm', 'add_layer_norm']

_LOW = (torch.bfloat16, torch.float16)


class _KernelLayerNorm(torch.autograd.Function):
    """The bf16 LayerNorm of :mod:`mmplugin.ops.layer_norm`, saving ``x`` and the row statistics."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = kernel.layer_norm_bf16(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = kernel.layer_norm_grad_bf16(dy, x, mean, rstd, weight)
        need = ctx.needs_input_grad
        return dx if need[0] else None, dw if need[1] else None, db if need[2] else None, None


def _plain_norm(norm: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``norm`` is a hook-free affine ``nn.LayerNorm`` over ``x``'s last dimension, outside ``torch.func``
    transforms: the module the kernels can stand in for (the parameters' dtypes are checked where they matter)."""
    return (type(norm) is nn.LayerNorm and not _hooked(norm) and norm.elementwise_affine and norm.weight is not None
            and norm.bias is not None and norm.normalized_shape == tuple(x.shape[-1:])
            and not torch._C._are_functorch_transforms_active())


def layer_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, with fp32 weight and bias gradients where ``norm`` is an ``nn.LayerNorm`` over the last dimension
    of a bf16 / fp16 CPU map in eager training, and by the bf16 kernel at inference (module docstring)."""
    if (x.dtype not in _LOW or x.device.type != 'cpu' or not eager_context() or not _plain_norm(norm, x)
            or norm.weight.dtype != torch.float32):
        return norm(x)
    kernel_serves = x.dtype == torch.bfloat16 and x.is_contiguous() and kernel.applies(x, norm.weight, norm.bias)
    if not (torch.is_grad_enabled() and (x.requires_grad or norm.weight.requires_grad or norm.bias.requires_grad)):
        return kernel.layer_norm_bf16(x, norm.weight, norm.bias, norm.eps, stats=False)[0] if kernel_serves else norm(x)
    if kernel_serves:
        return _KernelLayerNorm.apply(x, norm.weight, norm.bias, norm.eps)
    with torch.autocast('cpu', enabled=False):
        return F.layer_norm(x.float(), norm.normalized_shape, norm.weight, norm.bias, norm.eps).to(x.dtype)


def add_layer_norm(residual: torch.Tensor, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``residual + norm(x)`` (Swin V2's post-norm residual), at CPU inference in one pass of the LayerNorm kernel
    where it applies (:func:`mmplugin.ops.layer_norm.layer_norm_add`: an ``nn.LayerNorm`` over the last dimension
    with fp32 parameters and no hooks, ``x`` and ``residual`` fp32 or bf16 of one dtype and shape, no autograd);
    elsewhere ``residual + layer_norm(norm, x)``."""
    if (eager_context() and _plain_norm(norm, x)
            and not (torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad
                                                  or norm.weight.requires_grad or norm.bias.requires_grad))
            and kernel.add_applies(x, norm.weight, norm.bias, residual)):
        return kernel.layer_norm_add(x, norm.weight, norm.bias, norm.eps, residual)
    return residual + layer_norm(norm, x)


def _hooked(module: nn.Module) -> bool:
    """Forward or backward hooks of the module, or global ones, which only a module call runs."""
    from torch.nn.modules import module as m
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks)
