"""Memory layout of the returned feature maps, and of their gradients in training."""
from __future__ import annotations

import torch

from mmplugin.ops import transpose

__all__ = ['contiguous_nchw']

_MIN_BLOCKED = 60 * 60  # ATen copies a transposed matrix in cache blocks from this many elements on
_MAX_THREADS = 2  # ATen's blocked copy runs on one thread: measured ahead of the parallel strided copy up to 2 threads


def _blocked(x: torch.Tensor) -> bool:
    """A transpose pays off for this map (a CPU map, big enough): by the plugin's kernel on every thread count, or
    else by ATen's blocked copy on at most ``_MAX_THREADS`` threads (the callers check which)."""
    return x.device.type == 'cpu' and x.shape[1] * x.shape[2] * x.shape[3] >= _MIN_BLOCKED


def _to_nchw(x: torch.Tensor) -> torch.Tensor:
    """A channels_last ``(B, C, H, W)`` map copied to NCHW memory: one ``(H*W, C) -> (C, H*W)`` transpose per
    image where that pays off (the plugin's kernel, else ATen's blocked copy), else the strided copy."""
    kernel = transpose.serves(x)
    if not _blocked(x) or (not kernel and torch.get_num_threads() > _MAX_THREADS):
        return x.contiguous()
    b, c, h, w = x.shape
    out = torch.empty((b, c, h, w), dtype=x.dtype)
    if kernel and transpose.transpose_into(x.permute(0, 2, 3, 1), out, b, h * w, c):
        return out
    for i in range(b):  # (H*W, C) rows of image i, transposed into its (C, H*W) planes
        out[i].view(c, h * w).copy_(x[i].permute(1, 2, 0).reshape(h * w, c).t())
    return out


def _to_channels_last(g: torch.Tensor) -> torch.Tensor:
    """An NCHW ``(B, C, H, W)`` map copied to channels_last memory (the reverse of :func:`_to_nchw`)."""
    if g.is_contiguous(memory_format=torch.channels_last):
        return g
    kernel = transpose.serves(g)
    if not (g.is_contiguous() and _blocked(g)) or (not kernel and torch.get_num_threads() > _MAX_THREADS):
        return g.contiguous(memory_format=torch.channels_last)
    b, c, h, w = g.shape
    out = torch.empty((b, h, w, c), dtype=g.dtype)
    if kernel and transpose.transpose_into(g, out, b, c, h * w):
        return out.permute(0, 3, 1, 2)
    for i in range(b):  # (C, H*W) planes of image i, transposed into its (H*W, C) rows
        out[i].view(h * w, c).copy_(g[i].reshape(c, h * w).t())
    return out.permute(0, 3, 1, 2)


class _NchwWithChannelsLastGrad(torch.autograd.Function):
    """``x.contiguous()`` of a channels_last map whose gradient comes back channels_last, like ``x`` itself.

    Autograd hands a copy's gradient back as it arrives, i.e. NCHW, so the whole backward of a channels_last
    network would otherwise run on NCHW gradients beside channels_last activations, and PyTorch's BatchNorm and
    convolution backward with such mixed layouts run 2-5x slower than with one layout (2 cores of an Intel Xeon
    family 6 model 167, fp32: BatchNorm forward + backward at 2 x 48 x 128 x 192, 21.8 against 4.0 ms)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _to_nchw(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        if torch._C._functorch.is_batchedtensor(g) or torch._C._functorch.is_legacy_batchedtensor(g):
            return g  # batched gradients (``is_grads_batched``, vectorised jacobians) cannot query memory formats
        return _to_channels_last(g)

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor) -> torch.Tensor:
        return tangent.contiguous()  # forward-mode AD: the copy's own


def contiguous_nchw(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous()`` for a ``(B, C, H, W)`` map, the same values, faster where ``x`` is channels_last.

    The backbones compute in ``(B, H, W, C)`` memory (Swin's tokens, SwiftFormer's channels_last maps) and return
    contiguous NCHW maps (mmcv's CPU / CUDA ops, RoIAlign among them, read raw NCHW memory). ``x.contiguous()`` on a
    channels_last map is a 4-d strided copy that reads with a stride of C elements; here it is one ``(H*W, C) ->
    (C, H*W)`` matrix transpose per image, in tiles on every thread (:mod:`mmplugin.ops.transpose`; where that kernel
    cannot be built, ATen's blocked copy on one thread, with at most ``_MAX_THREADS`` threads). 2 cores of an Intel
    Xeon family 6 model 167, fp32, interleaved: Swin-T's stage-1 output at 800x1216 (96 x 200 x 304) takes 15.7 ms
    as the strided copy, 11.4 ms as ATen's blocked copy, 2.7-2.9 ms in the kernel.

    Under autograd the gradient is handed back channels_last, in the layout of ``x`` (see
    :class:`_NchwWithChannelsLastGrad`). Together with SwiftFormer's encoder adding its attention residual out of
    place under autograd (the other source of NCHW gradients), SwiftFormer-L1's training step at 512x768, batch 2,
    same CPU, interleaved, 7 rounds: fp32 997 -> 938 ms, bf16 autocast 606 -> 506 ms; Swin-T's level.
    Anything else (traced / exported / compiled graphs, ``torch.func`` transforms, tensor subclasses, quantized
    tensors, other devices) is ``x.contiguous()``.
    """
    if (torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()
            or torch.jit.is_tracing()  # first: graph capture sees nothing of the checks below
            or type(x) is not torch.Tensor or x.dim() != 4 or x.device.type != 'cpu' or x.is_quantized
            or torch._C._are_functorch_transforms_active()
            or x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last)
            or x.is_conj() or x.is_neg()):
        return x.contiguous()
    if torch.is_grad_enabled() and x.requires_grad:
        return _NchwWithChannelsLastGrad.apply(x)
    return _to_nchw(x)
