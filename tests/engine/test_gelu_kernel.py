"""The GELU-gradient kernel (``mmplugin.ops.gelu``) and the fp32 training MLP built on it
(``mmplugin.models.layers.recompute._GeluLinear``): ``grad * GELU'(h)`` and ``GELU(h)`` against the float64 formulas
on every vector ISA build, with lengths that fill no vector; non-finite values where PyTorch's kernels put them; in
place; where the kernel does not apply; the MLP's gradients against float64 autograd through the plain ops.

Bounds (``u`` the unit roundoff of the element type; fp32 erf from fits within 1.6e-7 relative, exp within 2 ulps):
``|d_h - exact| <= 6 u |g|`` and ``|GELU(h) - exact| <= 4 u |h|`` for fp32, a few ulps above the kernel's error
analysis (erf within 3 u absolute, ``h phi(h)`` within ``(h^2 + 5) u |h phi(h)|`` with ``|h^3 phi(h)| <= 0.47``,
two roundings), so they hold for any FMA contraction; bf16 adds its one rounding of the result (``u_bf16`` of
the result)."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from conftest import isa_kernel, require_compiler
from torch.utils.flop_counter import FlopCounterMode

from mmplugin.models.layers import recompute
from mmplugin.ops import gelu as gk
from mmplugin.testing.numeric import U_BF16, U_FP32

pytestmark = pytest.mark.numeric

_ARGS = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int]


@pytest.fixture
def kernel():
    require_compiler()
    assert gk.available(), 'the kernel does not build for this CPU\'s ISA'


def _inputs(n, dtype, seed=0):
    """``n`` values drawn from: normal values at three scales, a dense sweep across both erf regions and past the
    clamp at |h| = 4 sqrt(2), signed zeros and tiny / huge values (the whole pool, 10,013 values, at n >= its size)."""
    g = torch.Generator().manual_seed(seed)
    specials = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, 1.4142135])
    pool = torch.cat([torch.randn(2000, generator=g) * s for s in (0.5, 2.0, 6.0)]
                     + [torch.linspace(-12, 12, 4001), specials])
    h = pool[torch.randperm(len(pool), generator=g)] if n < len(pool) else pool.repeat(n // len(pool) + 1)
    h = h[:n]
    return h.to(dtype), torch.randn(n, generator=g).to(dtype)


def _exact(h, g):
    h, g = h.double(), g.double()
    return torch.ops.aten.gelu_backward(g, h), F.gelu(h)


def _check(h, g, d_h, act):
    u, extra = (U_FP32, 0.0) if h.dtype == torch.float32 else (U_FP32, U_BF16)
    want_d, want_a = _exact(h, g)
    tol = 1 + 1e-12  # the float64 reference's own rounding
    # bf16: the fp32 result (within the fp32 bound) rounded once, so its rounding is relative to that result
    fd, fa = 6 * u * g.double().abs(), 4 * u * h.double().abs()
    assert ((d_h.double() - want_d).abs() <= (fd + extra * (want_d.abs() + fd)) * tol).all()
    assert ((act.double() - want_a).abs() <= (fa + extra * (want_a.abs() + fa)) * tol).all()


@pytest.mark.parametrize('isa', ['AVX512_BF16', 'AVX512', 'AVX2', 'DEFAULT'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('n', [1, 3, 15, 17, 8201, 10013, 20026])  # below one vector; tails of 1-15 lanes
def test_every_isa_build_within_the_bounds(isa, dtype, n):
    suffix = 'f32' if dtype == torch.float32 else 'bf16'
    fn = isa_kernel('gelu', isa, f'mmplugin_gelu_grad_{suffix}', _ARGS)
    h, g = _inputs(n, dtype)
    for threads in (1, 3):
        d_h, act = torch.full_like(h, 7.0), torch.full_like(h, 7.0)
        assert fn(h.data_ptr(), g.data_ptr(), d_h.data_ptr(), act.data_ptr(), h.numel(), threads) == 0
        _check(h, g, d_h, act)
        only = torch.full_like(h, 7.0)  # without GELU(h): the gradient alone, the same bits
        fn(h.data_ptr(), g.data_ptr(), only.data_ptr(), None, h.numel(), threads)
        assert torch.equal(only, d_h)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_non_finite_values_land_where_pytorch_puts_them(kernel, dtype):
    """NaN stays NaN; +inf gives a NaN gradient (g * (1 + inf * 0)) and the activation PyTorch's fp32 / bf16 GELU
    gives on the ISA in use (NaN with AVX-512, inf with AVX2 and the generic kernels: the kernel is built for the
    same ISA); -inf NaN for both; a NaN or infinite incoming gradient reaches only its own element."""
    inf, nan = float('inf'), float('nan')
    h = torch.tensor([inf, -inf, nan, 0.5, -3.0, 2.0, 40.0, -40.0] * 3, dtype=dtype)
    g = torch.tensor([1.0, 1.0, 1.0, nan, inf, -inf, 1.0, 1.0] * 3, dtype=dtype)
    d_h, act = gk.gelu_grad(h, g, act=True)
    want_d, want_a = torch.ops.aten.gelu_backward(g, h), F.gelu(h)
    assert torch.equal(d_h.isnan(), want_d.isnan()) and torch.equal(act.isnan(), want_a.isnan())
    fin = ~want_d.isnan()
    assert torch.equal(d_h[fin].isinf(), want_d[fin].isinf()) and torch.equal(d_h[fin].sign(), want_d[fin].sign())
    assert d_h[6].item() == g[6].item() and act[6].item() == 40.0 and act[7].item() == 0.0


def test_in_place_and_fallbacks(kernel):
    h, g = _inputs(300, torch.float32)
    want, _ = gk.gelu_grad(h, g)
    buf = g.clone()
    d_h, act = gk.gelu_grad(h, buf, out=buf)
    assert d_h is buf and act is None and torch.equal(buf, want)
    # where it does not apply the caller runs PyTorch's ops: float64, mixed dtypes or shapes, strided views, an
    # output overlapping h, and under a Python dispatch mode (fake tensors, FLOP counting)
    assert gk.gelu_grad(h.double(), g.double()) is None
    assert gk.gelu_grad(h, g.bfloat16()) is None and gk.gelu_grad(h, g[:-1]) is None
    assert gk.gelu_grad(h[::2], g[::2]) is None
    assert gk.gelu_grad(h, g, out=h) is None
    with FlopCounterMode(display=False):
        assert gk.gelu_grad(h, g) is None


@pytest.mark.parametrize('frozen', ['nothing', 'weight', 'input'])
def test_training_mlp_gradients_in_fp32_within_their_bounds(kernel, frozen, monkeypatch):
    """``F.linear(GELU(h), w, b)`` of the recomputing training path in fp32, GELU(h) and its gradient from one
    kernel pass: each wanted gradient against float64 through the plain formulas, elementwise within the fp32
    products' worst case (inner length + 2) u of the summed magnitudes plus the kernel's own bounds above."""
    calls = []
    monkeypatch.setattr(recompute, 'gelu_grad', lambda *a, **k: calls.append(k) or gk.gelu_grad(*a, **k))
    gen = torch.Generator().manual_seed(3)
    h = (torch.randn(4, 9, 64, generator=gen) * 2).requires_grad_(frozen != 'input')
    w = torch.randn(24, 64, generator=gen).requires_grad_(frozen != 'weight')
    b = torch.randn(24, generator=gen).requires_grad_(frozen != 'weight')
    grad = torch.randn(4, 9, 24, generator=gen)
    got = dict(zip([n for n, t in zip('hwb', (h, w, b)) if t.requires_grad],
                   torch.autograd.grad(recompute._GeluLinear.apply(h, w, b), [t for t in (h, w, b) if t.requires_grad],
                                       grad)))
    assert calls == ([dict(act=frozen == 'nothing', out=calls[0]['out'])] if frozen != 'input' else [])
    u = U_FP32
    g2, h2, w64 = grad.double().reshape(-1, 24), h.detach().double().reshape(-1, 64), w.detach().double()
    slope = torch.ops.aten.gelu_backward(torch.ones_like(h2), h2)
    if 'h' in got:
        exact = (g2 @ w64) * slope
        bound = (24 + 10) * u * (g2.abs() @ w64.abs()) * slope.abs().clamp(min=1)
        assert ((got['h'].double().reshape(-1, 64) - exact).abs() <= bound).all()
    if 'w' in got:
        exact = g2.t() @ F.gelu(h2)
        bound = (36 + 8) * u * (g2.abs().t() @ (F.gelu(h2).abs() + h2.abs()))
        assert ((got['w'].double() - exact).abs() <= bound).all()
        assert ((got['b'].double() - g2.sum(0)).abs() <= (36 + 2) * u * g2.abs().sum(0)).all()


@pytest.mark.parametrize('name', ['window_attention', 'gelu', 'layer_norm', 'roi_align'])
def test_every_kernel_source_builds_without_vector_flags(name):
    """Built with no ISA flags at all (``load_kernels(name)``: the shared header's defaults), every kernel library
    compiles and loads."""
    from mmplugin.ops import build
    require_compiler()
    assert build.load_kernels(name) is not None
