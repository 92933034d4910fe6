"""The linear fusions of inference (oneDNN: bias, GELU and the residual add in the GEMM's epilogue) compute the
plain ops' function: within fp32 rounding of ``F.linear`` / ``F.gelu`` / ``+``, NaN in a row giving NaN in that row
only, and the plain ops themselves wherever autograd, tracing or ``onednn_fusion_disabled()`` rule fusion out."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_PARITY
from torch import nn

from mmplugin.models.layers.fusion import (
    _onednn_bf16,
    can_fuse_onednn,
    linear,
    linear_act,
    linear_add,
    onednn_fusion_disabled,
)
from mmplugin.testing.conformance import _GemmDtypes
from mmplugin.testing.numeric import REDUCED_VS_FP32
from mmplugin.utils.numerics import max_rel_error


def _operands():
    g = torch.Generator().manual_seed(0)
    layer = nn.Linear(40, 72)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(72, 40, generator=g) * 0.2)
        layer.bias.copy_(torch.randn(72, generator=g))
    return layer, torch.randn(2, 5, 7, 40, generator=g), torch.randn(2, 5, 7, 72, generator=g)


CASES = {
    'linear': (lambda x, lay, r: linear(x, lay), lambda x, lay, r: F.linear(x, lay.weight, lay.bias)),
    'gelu': (lambda x, lay, r: linear_act(x, lay, 'gelu'), lambda x, lay, r: F.gelu(F.linear(x, lay.weight, lay.bias))),
    'relu': (lambda x, lay, r: linear_act(x, lay, 'relu'), lambda x, lay, r: F.relu(F.linear(x, lay.weight, lay.bias))),
    'add': (lambda x, lay, r: linear_add(x, lay, r), lambda x, lay, r: F.linear(x, lay.weight, lay.bias) + r),
}


@pytest.mark.parametrize('case', list(CASES))
def test_fused_linear_equals_the_plain_ops(case):
    fused, plain = CASES[case]
    layer, x, r = _operands()
    with torch.inference_mode():
        ref = plain(x, layer, r)
        got = fused(x, layer, r)
        assert got.shape == ref.shape and max_rel_error(got, ref) <= FP32_PARITY
        with onednn_fusion_disabled():  # the plain ops, bit for bit
            assert torch.equal(fused(x, layer, r), ref)
        x[1, 2, 3, 4] = float('nan')  # NaN in one row: that output row is NaN, every other row finite
        out = fused(x, layer, r)
        assert out[1, 2, 3].isnan().all() and out.isnan().sum() == out.shape[-1]


def test_fused_linear_falls_back_under_autograd():
    """Training: the plain ops (their gradients), e.g. the residual's gradient is the output's."""
    layer, x, r = _operands()
    r.requires_grad_(True)
    linear_add(linear_act(x, layer, 'gelu')[..., :40], layer, r).sum().backward()
    assert torch.equal(r.grad, torch.ones_like(r)) and layer.weight.grad is not None


@pytest.mark.parametrize('case', list(CASES))
def test_where_nothing_fuses_the_module_itself_is_called(case):
    """Where no fused op applies (fusion off, float64, traced), the layer runs as a module call, so its forward hooks
    fire while tracing too; with replacement weights, or on the fused path, it is not called."""
    fused, plain = CASES[case]
    layer, x, r = _operands()
    calls = []
    layer.register_forward_hook(lambda mod, args, out: calls.append(args[0].dtype))
    with torch.inference_mode():
        fused(x, layer, r)
        fuses = case != 'relu' and can_fuse_onednn(x, layer.weight)  # ReLU runs as its own op (NaN stays NaN)
        assert calls == ([] if fuses else [torch.float32])
        calls.clear()
        with onednn_fusion_disabled():
            assert torch.equal(fused(x, layer, r), plain(x, layer, r))
        ref64 = nn.Linear(40, 72).double()
        ref64.load_state_dict(layer.state_dict())
        ref64.register_forward_hook(lambda mod, args, out: calls.append(args[0].dtype))
        assert torch.equal(fused(x.double(), ref64, r.double()), plain(x.double(), ref64, r.double()))
    assert calls == [torch.float32, torch.float64]
    calls.clear()
    with torch.inference_mode(), onednn_fusion_disabled():
        linear(x, layer, layer.weight * 2, layer.bias)  # replacement weights: not the module's function
    assert calls == []
    layer.requires_grad_(False)  # traced as constants of the graph
    traced = torch.jit.trace(lambda t: fused(t, layer, r), (x,), check_trace=False)
    assert calls == [torch.float32]
    assert torch.equal(traced(x), plain(x, layer, r))


def test_a_called_module_keeps_its_own_output_and_subclasses_are_not_called():
    """The module call's output belongs to its hooks: a forward hook keeping it sees ``linear(x)``, not the sum, and
    a full backward hook (whose output is a view autograd guards) trains; an ``nn.Linear`` subclass is not called
    (its forward may call these functions itself: no recursion, and the same function as on the fused path)."""
    layer, x, r = _operands()
    layer, x, r = layer.double(), x.double(), r.double()
    kept = []
    layer.register_forward_hook(lambda mod, args, out: kept.append(out))
    layer.register_full_backward_hook(lambda mod, gin, gout: None)
    r.requires_grad_(True)
    out = linear_add(x, layer, r)
    out.sum().backward()
    expected = F.linear(x, layer.weight, layer.bias)
    assert torch.equal(kept[0], expected) and torch.equal(out, expected + r)
    assert torch.equal(r.grad, torch.ones_like(r)) and layer.weight.grad is not None

    class Calls(nn.Linear):
        def forward(self, t):
            return linear(t, self)

    class Shifted(nn.Linear):
        def forward(self, t):
            return super().forward(t) + 1

    for cls in (Calls, Shifted):
        sub = cls(40, 72).double()
        sub.load_state_dict(layer.state_dict())
        with torch.no_grad():
            assert torch.equal(linear(x, sub), F.linear(x, sub.weight, sub.bias))
            assert torch.equal(linear_add(x, sub, r), F.linear(x, sub.weight, sub.bias) + r)


@pytest.mark.parametrize('case', list(CASES))
def test_a_trained_bias_alone_keeps_its_gradient(case):
    """Bias-only fine-tuning (weight frozen, input without gradient, bias trained): the oneDNN ops have no backward,
    so the plain ops must run, and the bias gradient equals the plain ops' in float64."""
    fused, plain = CASES[case]
    layer, x, r = _operands()
    layer.weight.requires_grad_(False)
    g = torch.randn(2, 5, 7, 72, generator=torch.Generator().manual_seed(1))
    fused(x, layer, r).backward(g)
    ref_layer = nn.Linear(40, 72).double()
    ref_layer.load_state_dict(layer.state_dict())
    plain(x.double(), ref_layer, r.double()).backward(g.double())
    assert layer.bias.grad is not None
    assert max_rel_error(layer.bias.grad, ref_layer.bias.grad) <= FP32_PARITY


@pytest.mark.numeric
@pytest.mark.parametrize('low', ['bfloat16', 'float16'])
@pytest.mark.parametrize('case', list(CASES))
def test_fused_linear_follows_cpu_autocast(case, low):
    """Under CPU autocast a fused op returns what the plain ops return there: the product in the autocast dtype (the
    oneDNN forms are on no autocast list, so they must cast as autocast does, or they would run a bf16 forward's
    GEMMs in fp32), within that dtype's rounding of fp32; an fp32 residual added to it stays fp32, as the reference
    formulations' ``x + f(x)`` (an in-place add would round the residual stream to bf16 / fp16 at every block)."""
    fused, plain = CASES[case]
    layer, x, r = _operands()
    dtype = getattr(torch, low)
    with torch.inference_mode():
        exact = plain(x, layer, r)
        with torch.autocast('cpu', dtype=dtype):
            ref = plain(x, layer, r)
            got = fused(x, layer, r)
            chained = linear_add(linear_act(x, layer, 'gelu')[..., :40], layer, r)  # a bf16 / fp16 input too
    with torch.autocast('cpu', dtype=dtype):  # training (the plain ops): the residual stream stays fp32 too
        trained = linear_add(x, layer, r.clone().requires_grad_(True))
    expected = torch.float32 if case == 'add' else dtype
    assert trained.dtype == torch.float32
    if dtype == torch.bfloat16 and case != 'relu' and _onednn_bf16():  # the fused form ran, in bf16
        gemms = _GemmDtypes()
        with torch.inference_mode(), torch.autocast('cpu', dtype=dtype), gemms:
            fused(x, layer, r)
        assert gemms.seen == {('mkldnn::_linear_pointwise', torch.bfloat16)}
    assert ref.dtype == got.dtype == expected and chained.dtype == torch.float32
    assert max_rel_error(got, exact) <= REDUCED_VS_FP32[{'bfloat16': 'bf16', 'float16': 'fp16'}[low]]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_all_finite_agrees_with_isfinite(dtype):
    """The one-pass check against ``torch.isfinite(x).all()``: NaN, +-Inf (alone and together, whose sum is NaN),
    finite values whose sum overflows the accumulator (still all finite), and an empty map."""
    from mmplugin.models.layers.fusion import all_finite
    big = torch.finfo(dtype).max
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(2, 3, 17, 19, generator=g).to(dtype), torch.full((64,), big, dtype=dtype),
             torch.full((64,), -big, dtype=dtype), torch.empty(0, dtype=dtype)]
    for bad in (float('nan'), float('inf'), float('-inf')):
        for where in (0, 5, -1):
            x = torch.randn(4, 33, generator=g).to(dtype)
            x.view(-1)[where] = bad
            cases.append(x)
    both = torch.zeros(10, dtype=dtype)
    both[2], both[7] = float('inf'), float('-inf')
    cases.append(both)
    for x in cases:
        assert all_finite(x) == bool(torch.isfinite(x).all()), x
    assert not all_finite(both) and all_finite(cases[1]) and all_finite(cases[3])
