"""fp32 CPU training linears on oneDNN (:mod:`mmplugin.models.layers.gemm`): the same function as ``F.linear``
and its gradients, checked against float64 within the worst-case rounding bound of an fp32 inner product, on
every kernel family; NaN where ``F.linear`` has it; higher derivatives; where the path applies and where not; the
default kernel by CPU vendor. The oneDNN path is switched on for every test (on Intel CPUs only thin linears'
forward products take it by default)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import U_FP32
from torch.utils._python_dispatch import TorchDispatchMode

from mmplugin.models.layers import gemm
from mmplugin.models.layers.gemm import onednn_training_gemms, train_linear

pytestmark = pytest.mark.skipif(not gemm._AVAILABLE, reason='torch built without oneDNN')


@pytest.fixture(autouse=True)
def _onednn_on():
    with onednn_training_gemms(True):
        yield


@pytest.mark.parametrize('vendor, onednn', [('GenuineIntel', False), ('AuthenticAMD', True), ('', True)])
def test_default_kernel_follows_the_cpu_vendor(vendor, onednn, monkeypatch):
    """BLAS (MKL) on Intel CPUs, oneDNN on AMD and where the vendor is unknown; a fresh process's default is its own
    CPU's (from /proc/cpuinfo, where there is one)."""
    from mmplugin.utils import cpu
    assert gemm.onednn_by_default(vendor) is onednn
    monkeypatch.setattr(cpu, 'cpu_vendor', lambda: vendor)
    assert gemm.onednn_by_default() is onednn
    monkeypatch.undo()
    own = cpu.cpu_vendor()
    fresh = subprocess.run([sys.executable, '-c', 'from mmplugin.models.layers import gemm; print(gemm._ENABLED)'],
                           capture_output=True, text=True, check=True).stdout.split()[-1]
    assert fresh == str(own != 'GenuineIntel')  # a new process starts on its own CPU's default


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


class _Ops(TorchDispatchMode):
    """Names of the ATen / oneDNN ops that run inside the block."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_forward_and_input_gradient_run_on_onednn_weight_gradient_on_blas():
    x, w, b = _operands()
    with _Ops() as fwd:
        y = train_linear(x, w, b)
    with _Ops() as bwd:
        y.backward(torch.ones_like(y))
    assert fwd.names.count('mkldnn::_linear_pointwise') == 1 and 'aten::addmm' not in fwd.names
    assert bwd.names.count('mkldnn::_linear_pointwise') == 1  # dX = dY W
    assert bwd.names.count('aten::mm') == 1  # dW = dY^T X


def test_blas_default_runs_thin_forward_products_on_onednn(monkeypatch):
    """With BLAS as the default (Intel CPUs), a linear of at most ``THIN_K`` input features still takes its forward
    product from oneDNN (no ``addmm`` pass writing the broadcast bias into the output first), its gradients from
    BLAS, within the inner-product bound of float64; a wider one is ``F.linear`` throughout."""
    monkeypatch.setattr(gemm, '_ENABLED', False)
    monkeypatch.setattr(gemm, '_THIN_FORWARD', True)
    x, w, b = _operands(shape=(2, 37, gemm.THIN_K))
    with _Ops() as fwd:
        y = train_linear(x, w, b)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    with _Ops() as bwd:
        y.backward(g)
    assert fwd.names.count('mkldnn::_linear_pointwise') == 1 and 'aten::addmm' not in fwd.names
    assert 'mkldnn::_linear_pointwise' not in bwd.names and bwd.names.count('aten::mm') == 2  # dY W, dY^T X
    x2, g2, wd = x.detach().reshape(-1, gemm.THIN_K), g.reshape(-1, 24), w.detach()
    ones = torch.ones(x2.shape[0], 1)  # the bias is one more term of each inner product
    _within_inner_product_bound(y.detach().reshape(-1, 24), torch.cat((x2, ones), 1),
                                torch.cat((wd.t(), b.detach()[None]), 0), x2.double() @ wd.double().t() + b.double())
    _within_inner_product_bound(x.grad.reshape(x2.shape), g2, w.detach(), g2.double() @ w.detach().double())
    _within_inner_product_bound(w.grad, g2.t(), x2, g2.double().t() @ x2.double())
    wide = _operands(shape=(2, 37, gemm.THIN_K + 1))
    assert not _on_onednn(train_linear(*wide))
    with onednn_training_gemms(False):  # off: BLAS for every product
        assert not _on_onednn(train_linear(x, w, b))


CASES = {
    'bias': dict(),
    'no bias': dict(bias=False),
    'strided input': dict(strided=True),
    'weight gradient only': dict(x_grad=False),
    'input gradient only': dict(w_grad=False),
    'one token': dict(shape=(48, ), n=24),
}


@pytest.mark.parametrize('case', list(CASES))
def test_forward_and_gradients_match_float64(case):
    opt = CASES[case]
    x, w, b = _operands(shape=opt.get('shape', (2, 37, 48)))
    if opt.get('strided'):  # a transposed view: (37, 48) with strides (1, 37)
        x = torch.randn(48, 37, generator=torch.Generator().manual_seed(3)).t().requires_grad_()
    b = b if opt.get('bias', True) else None
    x.requires_grad_(opt.get('x_grad', True))
    w.requires_grad_(opt.get('w_grad', True))
    y = train_linear(x, w, b)
    assert _on_onednn(y) and y.shape == (*x.shape[:-1], 24)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(g)
    x2, g2, wd = x.detach().reshape(-1, 48), g.reshape(-1, 24), w.detach()
    x64, w64, g64 = x2.double(), wd.double(), g2.double()
    want = x64 @ w64.t()
    if b is None:
        _within_inner_product_bound(y.detach().reshape(-1, 24), x2, wd.t(), want)
    else:  # the bias is one more term of each inner product
        ones = torch.ones(x2.shape[0], 1)
        _within_inner_product_bound(y.detach().reshape(-1, 24), torch.cat((x2, ones), 1),
                                    torch.cat((wd.t(), b.detach()[None]), 0), want + b.detach().double())
        _within_inner_product_bound(b.grad[None], torch.ones(1, g2.shape[0]), g2, g64.sum(0)[None])
    if x.requires_grad:
        assert x.grad.shape == x.shape
        _within_inner_product_bound(x.grad.reshape(-1, 48), g2, wd, g64 @ w64)
    else:
        assert x.grad is None
    if w.requires_grad:
        _within_inner_product_bound(w.grad, g2.t(), x2, g64.t() @ x64)
    else:
        assert w.grad is None


@pytest.mark.parametrize('case', ['strided bias', 'expanded bias', 'no input channels', 'no output channels'])
def test_unusual_operands_are_f_linears(case):
    """Operands oneDNN's linear would misread (it takes a bias as contiguous memory) or cannot take (empty
    weights) go to ``F.linear``: its values and gradients exactly."""
    x, w, b = _operands()
    if case == 'strided bias':
        b = torch.randn(48, generator=torch.Generator().manual_seed(2))[::2].requires_grad_()
    elif case == 'expanded bias':
        b = torch.randn(1, generator=torch.Generator().manual_seed(2)).expand(24).requires_grad_()
    elif case == 'no input channels':
        x, w = torch.randn(2, 5, 0, requires_grad=True), torch.randn(24, 0, requires_grad=True)
    else:
        w, b = torch.randn(0, 48, requires_grad=True), None
    got, want = train_linear(x, w, b), F.linear(x, w, b)
    assert not _on_onednn(got) and torch.equal(got, want)
    leaves = [t for t in (x, w, b) if t is not None and t.is_leaf]
    g = torch.ones_like(got)
    for a, r in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g)):
        assert torch.equal(a, r)


def test_under_torch_func_transforms_it_is_f_linear():
    """``torch.func`` transforms need functions with ``setup_context``; under them the plain op runs."""
    x, w, b = _operands()
    x, w, b = x.detach(), w.detach(), b.detach()
    got = torch.func.grad(lambda t: train_linear(t, w, b).pow(2).sum())(x)
    want = torch.func.grad(lambda t: F.linear(t, w, b).pow(2).sum())(x)
    assert torch.equal(got, want)


def test_mkldnn_switched_off_is_f_linear():
    """``torch.backends.mkldnn.flags(enabled=False)`` keeps every training linear on ``F.linear``."""
    x, w, b = _operands()
    with torch.backends.mkldnn.flags(enabled=False):
        assert not _on_onednn(train_linear(x, w, b))
    assert _on_onednn(train_linear(x, w, b))


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
    """A backward with ``create_graph=True`` (gradient penalties) stays differentiable: the second derivatives
    with respect to the input, weight and bias equal float64 ``F.linear``'s."""
    x, w, b = _operands()

    def second(fn, *leaves):
        (gx, ) = torch.autograd.grad(fn(*leaves).pow(2).sum(), leaves[0], create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), leaves)

    got = second(train_linear, x, w, b)
    want = second(F.linear, *(t.detach().double().requires_grad_() for t in (x, w, b)))
    for a, r in zip(got, want):
        assert (a.double() - r).abs().max() <= 1e-5 * r.abs().max()


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
    # d/dx of sum(x^T W^T) is W's column sums; d/dW is the token sums of x, read through the saved strided view
    _within_inner_product_bound(x.grad.t(), torch.ones(37, 24), w.detach(), torch.ones(37, 24).double() @ w.double())
    _within_inner_product_bound(w.grad, torch.ones(24, 37), xt.detach(), torch.ones(24, 37).double() @ xt.double())


def test_mismatched_shapes_get_f_linears_error():
    x, w, b = _operands()
    with pytest.raises(RuntimeError, match='cannot be multiplied'):
        train_linear(x, w[:, :40], b)
