"""Which kernel serves the linears of an fp32 CPU training step: on AMD and other non-Intel CPUs oneDNN for the
forward product and the input gradient, torch's BLAS for the weight gradient; on Intel CPUs torch's BLAS, but for the
forward products of thin linears (at most ``THIN_K`` = 128 input features), which run on oneDNN.

Why: ``F.linear`` and its autograd backward run on torch's BLAS (MKL in the x86 wheels), whose fp32 kernels on AMD
CPUs run Swin's thin products well below oneDNN's. Timed alone on AMD EPYC family 25 model 17 (Zen 4), 2 threads,
Swin-T's stage-1 shapes at 512x768, batch 2 (49,152 tokens), BLAS vs oneDNN in ms: forward ``96 -> 96`` 11.1 vs
6.2, ``384 -> 96`` 25.6 vs 19.0; input gradient ``288 -> 96`` 22.3 vs 15.9, ``96 -> 384`` 28.1 vs 20.1; weight
gradient ``dY^T X`` over the 49,152 tokens 19.0 vs 66.5. So the weight gradient stays on BLAS, which reads the
transposed operand in place (oneDNN's linear would need both operands copied into transposed layout).
:func:`mmplugin.analysis.gemm_floor.gemm_floor` times both kernels at every shape of a model. On the AVX2 Zen 2 /
Zen 3 parts measured the two kernels run within 10% of each other, so the choice costs nothing there. On an Intel
Xeon family 6 model 167 (AMX) the two are level within that machine's spread over whole steps (MKL 1.02-1.04x
faster in four runs and in an interleaved A/B, level in a fifth, oneDNN 1.02x faster in a sixth; docs/benchmarks.md),
and MKL needs no copy of the weight: the input gradient ``grad @ W`` of Swin-T's stage-4 MLP (``3072 x 768`` weight,
3072 tokens) takes 11.5 ms on BLAS against 14.7 ms on oneDNN with the weight transposed into a copy. So the default
follows the CPU vendor (:func:`onednn_by_default`): oneDNN where it is measured faster (AMD), MKL on Intel CPUs;
:func:`onednn_training_gemms` overrides it inside a block.

Thin linears on Intel: ``F.linear``'s ``addmm`` first writes the broadcast bias into the whole ``(M, N)`` output and
then adds the product to it, one more pass over the output against ``2 M N K`` multiply-adds, so it costs most where
``K`` is small; oneDNN adds the bias in the product's output tile. Timed alone on the same Xeon, 2 threads, Swin-T's
shapes at 512x768, batch 2, BLAS vs oneDNN forward in ms: ``49152 x 96 -> 288`` 17.0 vs 10.7, ``-> 384`` 22.9 vs
14.2, ``-> 96`` 4.6 vs 3.9, ``24576 x 128 -> 512`` 15.5 vs 12.6; at 192 input features level (``12288 x 192 -> 576``
9.9 vs 10.1), at 384 and more BLAS 2-8% faster. Whole training steps (forward + backward + AdamW, interleaved,
median of 7): Swin-T 2087 vs 2051 ms, Swin V2-T 2165 vs 2116 ms (5 rounds), SwiftFormer-L1 1063 vs 1046 ms. As
everywhere oneDNN serves a training linear, no module is called there, so forward hooks on those ``nn.Linear``
modules do not fire in eager fp32 CPU training (:func:`mmplugin.models.layers.fusion.linear`).

Swin's fc2 keeps its input gradient on BLAS (:mod:`.recompute`: an ``out=`` buffer).

oneDNN's plain linear (no post-op) keeps NaN and Inf as BLAS does. Applies in eager CPU fp32 autograd without
autocast (under bf16 autocast ``F.linear`` already runs on oneDNN) to well-formed operands; float64, CUDA,
tracing, export, ``torch.compile``, ``torch.func`` transforms and anything unusual (empty weights, a strided or
misplaced bias) use ``F.linear``, with its errors. A backward with ``create_graph=True`` computes the input
gradient with plain (differentiable) ops, so higher derivatives stay available.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

__all__ = ['THIN_K', 'onednn_ops_available', 'onednn_by_default', 'onednn_training_gemms', 'onednn_fp32',
           'onednn_forward', 'product',
           'input_grad', 'trains_on_onednn', 'train_linear']


def onednn_ops_available(*names: str) -> bool:
    """This torch build has oneDNN and its ops ``torch.ops.mkldnn.<name>`` for every name."""
    try:
        return torch.backends.mkldnn.is_available() and all(hasattr(torch.ops.mkldnn, n) for n in names)
    except Exception:  # pragma: no cover - builds without oneDNN
        return False


def onednn_by_default(vendor: str | None = None) -> bool:
    """Whether oneDNN serves the fp32 training linears' forward products and input gradients by default on a CPU of
    ``vendor`` (``vendor_id``, default this machine's): everywhere but on Intel CPUs, where MKL's are level with it
    and need no weight copies, and where only thin linears' forward products take oneDNN (module docstring)."""
    from mmplugin.utils.cpu import cpu_vendor
    return (cpu_vendor() if vendor is None else vendor) != 'GenuineIntel'


_AVAILABLE = onednn_ops_available('_linear_pointwise')
_ENABLED = onednn_by_default()  # oneDNN for the forward products and the input gradients
_THIN_FORWARD = True  # with _ENABLED off (Intel's default): oneDNN for the forward products of linears of at most
# THIN_K input features
THIN_K = 128


@contextmanager
def onednn_training_gemms(enabled: bool):
    """Turn the oneDNN training GEMMs on or off inside the block (process-wide; for A/B timing and tests): on, every
    forward product and input gradient runs on oneDNN; off, every product runs on BLAS."""
    global _ENABLED, _THIN_FORWARD
    before, _ENABLED, _THIN_FORWARD = (_ENABLED, _THIN_FORWARD), enabled, enabled
    try:
        yield
    finally:
        _ENABLED, _THIN_FORWARD = before


def _eager_fp32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """``x`` against ``weight`` is an eager fp32 CPU product (no autocast, tracing, compiling, export or
    ``torch.func`` transform), this build has oneDNN's linear and ``torch.backends.mkldnn`` is not switched off."""
    # tracing and compiling first: a compiled region never reaches the switch's query, which Dynamo cannot trace
    # (its graph break would run the rest of this test eagerly, and trace oneDNN's op into the compiled graph)
    return (not torch.jit.is_tracing() and not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and not torch.onnx.is_in_onnx_export() and not torch._C._are_functorch_transforms_active()
            and _AVAILABLE and x.device.type == 'cpu' and weight.device.type == 'cpu' and x.dtype == torch.float32
            and weight.dtype == torch.float32 and not torch.is_autocast_enabled('cpu')
            and torch._C._get_mkldnn_enabled())


def onednn_fp32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """``x`` against ``weight`` is an fp32 CPU product that oneDNN serves in every role, forward and input gradient
    (grad mode aside: also true inside an autograd function's forward / backward)."""
    return _ENABLED and _eager_fp32(x, weight)


def onednn_forward(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The forward product of ``x`` against the ``(N, K)`` ``weight`` runs on oneDNN: where :func:`onednn_fp32`,
    and with BLAS as the default (Intel CPUs) for thin linears, ``K <= THIN_K`` (module docstring)."""
    return _eager_fp32(x, weight) and (_ENABLED or (_THIN_FORWARD and weight.dim() == 2
                                                    and weight.shape[1] <= THIN_K))


def _fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Operands that make a linear (anything else goes to ``F.linear``, whose error names the shapes)."""
    return (weight.dim() == 2 and weight.numel() > 0 and x.dim() >= 1 and x.shape[-1] == weight.shape[1]
            and (bias is None or (bias.dtype == torch.float32 and bias.shape == weight.shape[:1]
                                  and bias.device.type == 'cpu' and bias.is_contiguous())))


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``(..., K)`` by ``(N, K)`` -> ``(..., N)``, on oneDNN where
    :func:`onednn_forward`; no autograd of its own (for use inside autograd functions)."""
    if onednn_forward(x, weight) and _fits(x, weight, bias):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight.contiguous(), bias, 'none', [], '')
    return F.linear(x, weight, bias)


def input_grad(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``grad @ weight``: ``(..., N)`` by ``(N, K)`` -> ``(..., K)``, the input gradient of a linear; on oneDNN
    (with the small weight transposed into a copy) where :func:`onednn_fp32` and no graph is being recorded."""
    if onednn_fp32(grad, weight) and not torch.is_grad_enabled():
        return torch.ops.mkldnn._linear_pointwise(grad.contiguous(), weight.t().contiguous(), None, 'none', [], '')
    return grad.matmul(weight)


class _Linear(torch.autograd.Function):
    """``F.linear`` with the forward product on oneDNN, the input gradient on oneDNN where :func:`onednn_fp32` (else
    BLAS), the weight gradient on BLAS."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        d_x = input_grad(grad, weight) if ctx.needs_input_grad[0] else None
        d_w = g2.t().mm(x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        d_b = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return d_x, d_w, d_b


def trains_on_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """:func:`train_linear` runs ``x`` against ``weight`` on oneDNN (fp32 CPU autograd, well-formed operands)."""
    return (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad) and onednn_forward(x, weight)
            and _fits(x, weight, bias))


def train_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on ``(..., K)`` -> ``(..., N)``; in fp32 CPU autograd through oneDNN as the
    module docstring says, elsewhere ``F.linear`` itself."""
    if trains_on_onednn(x, weight, bias):
        # 2-D inside the function: oneDNN returns an N-D result as a view, and a custom function's output must not be
        # one (a later in-place add, e.g. a residual, would be refused)
        return _Linear.apply(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)
