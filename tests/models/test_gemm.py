"""fp32 CPU training linears on oneDNN (:mod:`mmplugin.models.layers.gemm`): the same function as ``F.linear``
and its gradients, checked against float64 within the worst-case rounding bound of an fp32 inner product, on
every kernel family; NaN where ``F.linear`` has it; higher derivatives; where the path applies and where not."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import U_FP32

from mmplugin.models.layers import gemm
from mmplugin.models.layers.gemm import onednn_training_gemms, train_linear

pytestmark = pytest.mark.skipif(not gemm._AVAILABLE, reason='torch built without oneDNN')


def _operands(shape=(2, 37, 48), n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(n, shape[-1], generator=g, requires_grad=True)
    b = torch.randn(n, generator=g, requires_grad=True)
    return x, w, b


def _on_onednn(y: torch.Tensor) -> bool:
    """``y`` came from the oneDNN function (through the view that restores its leading dimensions)."""
    fn = y.grad_fn
    while fn is not None and fn.name().startswith('View'):
        fn = fn.next_functions[0][0]
    return fn is not None and fn.name().endswith('_LinearBackward')


def _within_inner_product_bound(got: torch.Tensor, a: torch.Tensor, bmat: torch.Tensor, want: torch.Tensor):
    """``|got - want| <= K u |a| |b|`` elementwise (``want`` float64 of ``a @ b``, ``K`` the inner dimension, plus
    the rounding of the result): the worst case of any fp32 summation order, so it holds for every kernel."""
    k = a.shape[-1]
    bound = (k + 2) * U_FP32 * (a.double().abs() @ bmat.double().abs())
    assert ((got.double() - want).abs() <= bound).all()


def test_forward_and_gradients_match_float64():
    x, w, b = _operands()
    y = train_linear(x, w, b)
    assert _on_onednn(y)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(g)
    x64, w64, b64, g64 = x.detach().double(), w.detach().double(), b.detach().double(), g.double()
    x2, g2 = x.detach().reshape(-1, 48), g.reshape(-1, 24)
    ones = torch.ones(x2.shape[0], 1, dtype=x2.dtype)
    # forward: the bias is one more term of each inner product
    w_and_b = torch.cat((w.detach().t(), b.detach()[None]), 0)
    _within_inner_product_bound(y.detach().reshape(-1, 24), torch.cat((x2, ones), 1), w_and_b,
                                F.linear(x64, w64, b64).reshape(-1, 24))
    _within_inner_product_bound(x.grad.reshape(-1, 48), g2, w.detach(), (g64 @ w64).reshape(-1, 48))
    _within_inner_product_bound(w.grad, g2.t(), x2, g64.reshape(-1, 24).t() @ x64.reshape(-1, 48))
    _within_inner_product_bound(b.grad[None], torch.ones(1, g2.shape[0]), g2, g64.reshape(-1, 24).sum(0)[None])


def test_switch_restores_f_linear():
    x, w, b = _operands()
    with onednn_training_gemms(False):
        y = train_linear(x, w, b)
    assert not _on_onednn(y)
    assert _on_onednn(train_linear(x, w, b))


@pytest.mark.parametrize('case', ['no grad', 'float64', 'autocast'])
def test_other_cases_are_f_linear_itself(case):
    x, w, b = _operands()
    if case == 'float64':
        x, w, b = (t.detach().double().requires_grad_() for t in (x, w, b))
        assert torch.equal(train_linear(x, w, b), F.linear(x, w, b))
    elif case == 'no grad':
        with torch.no_grad():
            assert torch.equal(train_linear(x, w, b), F.linear(x, w, b))
    else:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            got, want = train_linear(x, w, b), F.linear(x, w, b)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_nan_and_inf_land_where_f_linear_puts_them():
    """NaN in, NaN out: a NaN token poisons its own output row and, in the weight gradient, every entry (it sums
    over the tokens); an Inf weight entry turns a whole output column non-finite. Same pattern as ``F.linear``."""
    x, w, b = _operands()
    with torch.no_grad():
        x[0, 3, 5] = float('nan')
        w[7, 2] = float('inf')
    got, want = train_linear(x, w, b), F.linear(x, w, b)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    (gx, gw, gb) = torch.autograd.grad(got.sum(), (x, w, b))
    (rx, rw, rb) = torch.autograd.grad(want.sum(), (x, w, b))
    for a, r in ((gx, rx), (gw, rw), (gb, rb)):
        assert torch.equal(a.isnan(), r.isnan()) and torch.equal(a.isinf(), r.isinf())


def test_second_derivatives_equal_f_linears():
    """A backward with ``create_graph=True`` (gradient penalties) stays differentiable."""
    x, w, b = _operands()
    (gx, ) = torch.autograd.grad(train_linear(x, w, b).pow(2).sum(), x, create_graph=True)
    (want, ) = torch.autograd.grad(F.linear(x, w, b).pow(2).sum(), x, create_graph=True)
    gx.pow(2).sum().backward()
    got_w = w.grad.clone()
    w.grad = None
    want.pow(2).sum().backward()
    torch.testing.assert_close(got_w, w.grad, rtol=1e-4, atol=1e-3)


def test_output_takes_an_in_place_residual_and_strided_inputs():
    """The residual add of a block runs in place on the product; a transposed (non-contiguous) input is read as
    its values."""
    x, w, b = _operands(shape=(37, 48))
    x = x.detach().t().contiguous().requires_grad_()  # (48, 37)
    xt = x.t()  # (37, 48), strided
    r = torch.randn(37, 24, requires_grad=True)
    out = train_linear(xt, w, b)
    assert _on_onednn(out)
    out.add_(r)
    out.sum().backward()
    assert torch.equal(r.grad, torch.ones_like(r))
    torch.testing.assert_close(x.grad, w.detach().sum(0)[:, None].expand(48, 37).contiguous(), rtol=1e-5, atol=1e-5)


def test_mismatched_shapes_get_f_linears_error():
    x, w, b = _operands()
    with pytest.raises(RuntimeError, match='cannot be multiplied'):
        train_linear(x, w[:, :40], b)
