"""The convolutional MLP's recomputing op (mmplugin.models.layers.recompute_conv): gradients (gradcheck in float64),
each combination of wanted gradients against autograd through the plain ops, the fp32 path through the GELU kernel
against float64 in both memory formats, a forward equal to the plain ops' bit for bit, and the inference and
autocast paths left as they were."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_PARITY, FP64_PARITY, rel_err

from mmplugin.models.layers import recompute_conv
from mmplugin.ops.gelu import available as gelu_kernel_available

pytestmark = pytest.mark.numeric


def _f64(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()


@pytest.mark.parametrize('bias', [True, False])
def test_gradients(bias):
    h, w = _f64(2, 6, 3, 5, seed=0), _f64(4, 6, 1, 1, seed=1)
    b = _f64(4, seed=2) if bias else None
    assert torch.autograd.gradcheck(lambda h, w, *b: recompute_conv._GeluConv1x1.apply(h, w, *(b or [None])),
                                    (h, w, *([b] if bias else [])))


@pytest.mark.parametrize('frozen', ['nothing', 'weight', 'input', 'bias'])
def test_backward_equals_autograd_whichever_gradients_are_asked(frozen):
    """GELU(h) recomputed only where the weight or bias gradient needs it, GELU's gradient in place on fc2's input
    gradient; float64 (PyTorch's GELU ops), against autograd through ``conv2d(gelu(h))``."""
    h, w, bb = _f64(2, 16, 5, 7, seed=0), _f64(5, 16, 1, 1, seed=1), _f64(5, seed=2)
    if frozen == 'weight':
        w = w.detach()
    elif frozen == 'input':
        h = h.detach()
    elif frozen == 'bias':
        bb = bb.detach()
    wanted = [t for t in (h, w, bb) if t.requires_grad]
    g = torch.randn(2, 5, 5, 7, dtype=torch.float64)
    got = torch.autograd.grad(recompute_conv._GeluConv1x1.apply(h, w, bb), wanted, g)
    want = torch.autograd.grad(F.conv2d(F.gelu(h), w, bb), wanted, g)
    assert len(got) == len(want) == len(wanted)
    for a, b in zip(got, want):
        assert rel_err(a, b) <= FP64_PARITY


CL, NCHW = torch.channels_last, torch.contiguous_format


@pytest.mark.skipif(not gelu_kernel_available(), reason='no C compiler for the GELU kernel')
@pytest.mark.parametrize('shape, h_format, w_format', [
    ((2, 64, 9, 11), CL, CL), ((2, 64, 9, 11), NCHW, NCHW),
    # C == H == W: a channels_last map has an NCHW map's shape and strides once viewed channels-last, so only the
    # strides of the tensors themselves tell the layouts apart
    ((2, 8, 8, 8), CL, CL), ((2, 8, 8, 8), NCHW, NCHW), ((2, 8, 8, 8), NCHW, CL), ((2, 8, 8, 8), CL, NCHW)])
def test_fp32_gradients_through_the_kernel_against_float64(shape, h_format, w_format, monkeypatch):
    """fp32, where the GELU kernel computes GELU's gradient and GELU(h) in one pass over the maps' memory as it is:
    each gradient within fp32 parity of the float64 formulation, whatever the two tensors' memory formats, and the
    kernel ran (once, with GELU(h) asked for) where the map and its gradient share their layout."""
    from mmplugin.ops import gelu as gelu_ops
    calls = []
    real = recompute_conv.gelu_grad
    monkeypatch.setattr(recompute_conv, 'gelu_grad', lambda *a, **k: calls.append(k.get('act')) or real(*a, **k))
    assert gelu_ops.available()
    b_, c, hh, ww = shape
    h64, w64, b64 = _f64(*shape, seed=3), _f64(24, c, 1, 1, seed=4), _f64(24, seed=5)
    g64 = torch.randn(b_, 24, hh, ww, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    want = torch.autograd.grad(F.conv2d(F.gelu(h64), w64, b64), (h64, w64, b64), g64)
    h = h64.detach().float().to(memory_format=h_format).requires_grad_()
    w = w64.detach().float().to(memory_format=w_format).requires_grad_()
    b = b64.detach().float().requires_grad_()
    out = recompute_conv.gelu_conv1x1(h, w, b)
    assert out.grad_fn.name().endswith('_GeluConv1x1Backward')
    got = torch.autograd.grad(out, (h, w, b), g64.float().to(memory_format=h_format))
    if h_format == w_format:
        assert calls == [True]
    for a, e in zip(got, want):
        assert rel_err(a.double(), e) <= FP32_PARITY


def test_forward_is_the_plain_ops_bit_for_bit():
    torch.manual_seed(0)
    h = torch.randn(2, 32, 6, 9).to(memory_format=torch.channels_last).requires_grad_()
    w, b = torch.randn(8, 32, 1, 1, requires_grad=True), torch.randn(8, requires_grad=True)
    got = recompute_conv.gelu_conv1x1(h, w, b)
    assert got.grad_fn.name().endswith('_GeluConv1x1Backward')
    assert torch.equal(got, F.conv2d(F.gelu(h), w, b))


def test_plain_ops_outside_eager_fp32_training():
    """No gradient wanted, CPU bf16 autocast, or a convolution that is not 1x1: the plain ops (autograd's own nodes
    where a gradient is wanted), equal outputs."""
    h = torch.randn(1, 16, 4, 5, requires_grad=True)
    w, b = torch.randn(8, 16, 1, 1, requires_grad=True), torch.randn(8, requires_grad=True)
    with torch.no_grad():
        assert torch.equal(recompute_conv.gelu_conv1x1(h, w, b), F.conv2d(F.gelu(h), w, b))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = recompute_conv.gelu_conv1x1(h, w, b)
        assert out.dtype == torch.bfloat16 and not out.grad_fn.name().endswith('_GeluConv1x1Backward')
    w3 = torch.randn(8, 16, 3, 3, requires_grad=True)
    out = recompute_conv.gelu_conv1x1(h, w3, None)
    assert not out.grad_fn.name().endswith('_GeluConv1x1Backward') and torch.equal(out, F.conv2d(F.gelu(h), w3))
