"""LayerNorm of reduced-precision maps in CPU training (``mmplugin.ops.layer_norm``, ``layer_norm.c``, and
``mmplugin.models.layers.low_precision_norm``): the bf16 kernel against the float64 formulas on every vector ISA build
(channel counts that fill no vector, one row and many); the weight and bias gradients summed in fp32 over many rows,
where PyTorch's own mixed-type backward loses them; NaN where the formulas put it; repeatable bits; where the plain
module runs; and a Swin's LayerNorm gradients under bf16 autocast against its fp32 ones.

Bounds (``u`` fp32's unit roundoff, ``C`` channels, ``R`` rows): the row statistics are fp32 sums of C terms, so the
normalised values are within ``k = (2C + 8) u`` of exact relative to ``|xhat|`` plus one; the outputs add bf16's
rounding (``U_BF16`` of the result). The input gradient ``rstd (gy - mean(gy) - xhat mean(gy xhat))`` carries the
error of ``rstd``, of ``xhat`` and of two C-term means, each within ``k`` of its term's magnitude: ``4 k`` of the
terms' magnitudes. The weight and bias gradients are R-term fp32 sums of those, within ``(R + 2C + 16) u`` of the
summed magnitudes."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from conftest import isa_kernel, require_compiler
from torch import nn

from mmplugin.models.layers.low_precision_norm import layer_norm
from mmplugin.ops import layer_norm as lk
from mmplugin.testing.numeric import BF16_VS_FP32, U_BF16, U_FP32

pytestmark = pytest.mark.numeric

_P, _I = ctypes.c_void_p, ctypes.c_int64
_FWD = [_P, _P, _P, ctypes.c_float, _I, _I, _P, _P, _P, ctypes.c_int]
_BWD = [_P, _P, _P, _P, _P, _I, _I, _P, _P, _P, ctypes.c_int]


@pytest.fixture
def kernel():
    require_compiler()
    assert lk.available(), 'the kernel does not build for this CPU\'s ISA'


def _inputs(rows, c, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, c, generator=g) * 3 + 2).bfloat16()
    w, b = torch.randn(c, generator=g), torch.randn(c, generator=g)
    dy = (torch.randn(rows, c, generator=g) + 0.5).bfloat16()
    return x, w, b, dy


def _exact(x, w, b, dy, eps=1e-5):
    """float64 forward, statistics and gradients of the formulas, and the magnitudes the bounds scale with."""
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    mean = x64.mean(-1, keepdim=True)
    rstd = 1 / (x64.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    xh = (x64 - mean) * rstd
    y = xh * w64 + b.double()
    gy = dy64 * w64
    dx = rstd * (gy - gy.mean(-1, keepdim=True) - xh * (gy * xh).mean(-1, keepdim=True))
    dx_mag = rstd * (gy.abs() + gy.abs().mean(-1, keepdim=True) + xh.abs() * (gy * xh).abs().mean(-1, keepdim=True))
    return y, mean.squeeze(-1), rstd.squeeze(-1), dx, dx_mag, (dy64 * xh).sum(0), dy64.sum(0), xh


def _check(x, w, b, dy, y, mean, rstd, dx, dw, db):
    rows, c = x.shape
    ey, em, er, edx, dx_mag, edw, edb, xh = _exact(x, w, b, dy)
    k = (2 * c + 8) * U_FP32
    assert ((mean.double() - em).abs() <= k * x.double().abs().mean(-1)).all()
    assert ((rstd.double() - er).abs() <= k * er).all()
    y_tol = k * (xh.abs() + 1) * w.double().abs() + U_FP32 * b.double().abs() + U_BF16 * ey.abs()
    assert ((y.double() - ey).abs() <= y_tol).all()
    assert ((dx.double() - edx).abs() <= 4 * k * dx_mag + U_BF16 * edx.abs()).all()
    kk = (rows + 2 * c + 16) * U_FP32
    assert ((dw.double() - edw).abs() <= kk * (dy.double().abs() * (xh.abs() + 1)).sum(0)).all()
    assert ((db.double() - edb).abs() <= kk * dy.double().abs().sum(0)).all()


@pytest.mark.parametrize('isa', ['AVX512_BF16', 'AVX512', 'AVX2', 'DEFAULT'])
@pytest.mark.parametrize('rows, c', [(1, 96), (37, 100), (5, 7), (300, 384)])
def test_every_isa_build_within_the_bounds(isa, rows, c):
    fwd = isa_kernel('layer_norm', isa, 'mmplugin_layer_norm_bf16', _FWD)
    bwd = isa_kernel('layer_norm', isa, 'mmplugin_layer_norm_grad_bf16', _BWD)
    x, w, b, dy = _inputs(rows, c)
    y, mean, rstd = torch.empty_like(x), torch.empty(rows), torch.empty(rows)
    assert fwd(x.data_ptr(), w.data_ptr(), b.data_ptr(), 1e-5, rows, c, y.data_ptr(), mean.data_ptr(),
               rstd.data_ptr(), 3) == 0
    # rows are normalised a few at a time, each with the arithmetic of a call on that row alone; inference passes no
    # statistics and gets the same bits
    alone, bare = torch.empty_like(x), torch.empty_like(x)
    for r in range(rows):
        assert fwd(x[r].data_ptr(), w.data_ptr(), b.data_ptr(), 1e-5, 1, c, alone[r].data_ptr(), None, None, 1) == 0
    assert fwd(x.data_ptr(), w.data_ptr(), b.data_ptr(), 1e-5, rows, c, bare.data_ptr(), None, None, 2) == 0
    assert torch.equal(alone.view(torch.int16), y.view(torch.int16)) and torch.equal(bare.view(torch.int16),
                                                                                      y.view(torch.int16))
    out = []
    for threads in (1, 3, 3):
        dx, dw, db = torch.empty_like(x), torch.full((c, ), 7.0), torch.full((c, ), 7.0)
        assert bwd(dy.data_ptr(), x.data_ptr(), mean.data_ptr(), rstd.data_ptr(), w.data_ptr(), rows, c,
                   dx.data_ptr(), dw.data_ptr(), db.data_ptr(), threads) == 0
        _check(x, w, b, dy, y, mean, rstd, dx, dw, db)
        out.append((dx, dw, db))
    assert all(torch.equal(a, e) for a, e in zip(out[1], out[2]))  # the same bits at a given thread count
    assert torch.equal(out[0][0], out[1][0])  # rows are independent: dx does not depend on the threads


@pytest.mark.parametrize('isa', ['AVX512_BF16', 'AVX512', 'AVX2', 'DEFAULT'])
def test_bf16_stores_round_to_nearest_even_subnormals_included(isa):
    """Constant rows normalise to exactly ``beta`` in fp32 (``x - mean`` is 0, and ``0 * rstd * 1 + beta`` is
    ``beta``'s bits), so the stored bf16 bits must be ``beta``'s rounding to nearest even as torch's conversion gives
    it, NaN excepted: a NaN keeps its sign and payload's upper bits, made quiet, ``(bits >> 16) | 0x40``. The
    AVX512_BF16 build's conversion instruction treats subnormal inputs as zero, so a vector holding one must take the
    integer rounding. 64 channels, four vectors of 16 (as many AVX2 / generic vectors of 8 / 4): only normal values;
    normal values with one subnormal lane; only subnormal values; ties, NaN payloads, infinities and values that round
    up to infinity, with no subnormal, so that in the AVX512_BF16 build the instruction's own rounding meets them."""
    fwd = isa_kernel('layer_norm', isa, 'mmplugin_layer_norm_bf16', _FWD)
    g = torch.Generator().manual_seed(3)
    normal = torch.randn(16, generator=g) * 100
    one_tiny = torch.randn(16, generator=g)
    one_tiny[5] = 3.3e-39  # an fp32 subnormal whose rounding is not zero
    tiny = torch.rand(16, generator=g) * 1.1e-38 * torch.where(torch.arange(16) % 2 == 0, 1.0, -1.0)
    tiny[:3] = torch.tensor([-2.0 ** -130, 1e-45, -1e-45])
    special = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -126 * (1 + 2 ** -8), 0.0, float('inf'),
                            -float('inf'), 0.0, 1.0, 3.0e38, 1 + 2 ** -9, 1 + 2 ** -8 + 2 ** -20, 0.0, 0.0, 65504.0,
                            7.0])
    bits = special.view(torch.int32)
    bits[4] = 0x7F800001  # a signalling NaN with payload 1
    bits[7] = 0xFFA12345 - (1 << 32)  # a negative NaN with a payload in its upper bits
    bits[12] = 0x7F7FFFFF  # the largest finite fp32 value and a tie just below it: both round up to infinity
    bits[13] = 0x7F7F8000
    beta = torch.cat([normal, one_tiny, tiny, special])
    c, rows = beta.numel(), 3
    x = torch.full((rows, c), 1.5).bfloat16()
    y = torch.empty_like(x)
    assert fwd(x.data_ptr(), torch.ones(c).data_ptr(), beta.data_ptr(), 1e-5, rows, c, y.data_ptr(), None, None,
               2) == 0
    want = beta.to(torch.bfloat16).view(torch.int16).clone()
    nan = beta.isnan()
    want[nan] = ((beta.view(torch.int32)[nan] >> 16) | 0x40).to(torch.int16)
    assert torch.equal(y.view(torch.int16), want.expand(rows, c))
    assert nan.sum() == 2 and want[60:62].eq(0x7F80).all()  # the cases are what they are meant to be
    assert (want[16:48] & 0x7F80 == 0).sum() > 16  # the subnormal vectors store subnormals


_ADD = [_P, _P, _P, ctypes.c_float, _I, _I, _P, _P, ctypes.c_int]


@pytest.mark.parametrize('isa', ['AVX512_BF16', 'AVX512', 'AVX2', 'DEFAULT'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('rows, c', [(1, 96), (37, 100), (5, 7), (300, 384)])
def test_layer_norm_add_within_the_bounds(isa, dtype, rows, c):
    """``residual + LayerNorm(x)`` in one pass (Swin V2's post-norm residual at inference), fp32 and bf16 on every
    ISA build: within the LayerNorm's bound of the float64 formula plus the sum's rounding to the output dtype
    (``u`` of the result), every thread count the same bits; NaN in x makes its row NaN, NaN in the residual its
    element, as the two ops give it."""
    suffix = 'f32' if dtype == torch.float32 else 'bf16'
    fn = isa_kernel('layer_norm', isa, f'mmplugin_layer_norm_add_{suffix}', _ADD)
    x, w, b, dy = _inputs(rows, c, seed=2)
    if dtype == torch.float32:  # values that bf16 cannot hold: an fp32 entry that rounds its operands shows
        g = torch.Generator().manual_seed(3)
        x, res = torch.randn(rows, c, generator=g) * 3 + 2, torch.randn(rows, c, generator=g) * 4
    else:
        res = (dy.double() * 4).to(dtype)
    ey, _, _, _, _, _, _, xh = _exact(x, w, b, dy)
    want = res.double() + ey
    u = U_FP32 if dtype == torch.float32 else U_BF16 + U_FP32  # the sum rounded to fp32, then to bf16
    k = (2 * c + 8) * U_FP32
    tol = k * (xh.abs() + 1) * w.double().abs() + U_FP32 * b.double().abs() + u * want.abs()
    outs = []
    for threads in (1, 3):
        y = torch.empty_like(x)
        assert fn(x.data_ptr(), w.data_ptr(), b.data_ptr(), 1e-5, rows, c, res.data_ptr(), y.data_ptr(), threads) == 0
        assert ((y.double() - want).abs() <= tol).all()
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    x[0, c // 2], res[-1, c - 1] = float('nan'), float('nan')
    y = torch.empty_like(x)
    assert fn(x.data_ptr(), w.data_ptr(), b.data_ptr(), 1e-5, rows, c, res.data_ptr(), y.data_ptr(), 2) == 0
    ref = res.float() + F.layer_norm(x.float(), (c, ), w, b, 1e-5)
    assert torch.equal(y.isnan(), ref.isnan()) and y[0].isnan().all()


def test_add_layer_norm_runs_the_kernel_at_inference_only(kernel, monkeypatch):
    """Swin V2's ``residual + norm(x)``: one kernel pass at inference (fp32 or bf16, one dtype), within the two ops'
    result by both their bounds from the float64 formula (the LayerNorm's, its rounding to the dtype where the two
    ops round it, the sum's); with autograd, hooks, mixed dtypes or strided maps the two ops themselves, the same
    bits as ``residual + layer_norm(norm, x)``."""
    from mmplugin.models.layers.low_precision_norm import add_layer_norm
    x, w, b, dy = _inputs(300, 48)
    g = torch.Generator().manual_seed(4)
    x32, dy32 = torch.randn(300, 48, generator=g) * 3 + 2, torch.randn(300, 48, generator=g)  # not bf16 values
    norm = nn.LayerNorm(48)
    with torch.no_grad():
        norm.weight.copy_(w), norm.bias.copy_(b)
    calls, fused = [], lk.layer_norm_add
    monkeypatch.setattr(lk, 'layer_norm_add', lambda *a: calls.append(a[0].dtype) or fused(*a))
    for dtype in (torch.float32, torch.bfloat16):
        xd, res = (x32, dy32) if dtype == torch.float32 else (x, dy)
        with torch.no_grad():
            got, ref = add_layer_norm(res, norm, xd), res + layer_norm(norm, xd)
        ey, _, _, _, _, _, _, xh = _exact(xd, w, b, res)
        exact, u, k = res.double() + ey, (U_FP32 if dtype == torch.float32 else U_BF16 + U_FP32), (2 * 48 + 8) * U_FP32
        ln_tol = k * (xh.abs() + 1) * w.double().abs() + U_FP32 * b.double().abs()
        tol = 2 * ln_tol + u * (2 * exact.abs() + ey.abs())
        assert got.dtype == dtype and ((got.double() - ref.double()).abs() <= tol).all()
    assert calls == [torch.float32, torch.bfloat16]
    xr = x.float().requires_grad_()
    res = dy.float()
    assert torch.equal(add_layer_norm(res, norm, xr), res + layer_norm(norm, xr))  # training: the two ops
    with torch.no_grad():
        assert torch.equal(add_layer_norm(res.bfloat16(), norm, x.float()), res.bfloat16() + norm(x.float()))
        strided = x.float().t().contiguous().t()
        assert torch.equal(add_layer_norm(res, norm, strided), res + norm(strided))
        handle = norm.register_forward_hook(lambda *a: calls.append('hook'))
        add_layer_norm(res, norm, x.float())
        handle.remove()
    assert calls == [torch.float32, torch.bfloat16, 'hook']


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_weight_and_bias_gradients_over_many_rows(dtype):
    """Swin-T's stage-1 LayerNorm at 512x768, batch 2 (49,152 rows of 96 channels) under CPU autocast: the weight
    and bias gradients within fp32 summation bounds of float64 (bf16 through the kernel, or the widened fallback
    where none is built; fp16 through the widened fallback), the input gradient within the reduced dtype's rounding.
    PyTorch's mixed-type backward sums these in the input's precision: an 11x too small bias gradient in bf16."""
    x, w, b, dy = _inputs(49152, 96, seed=1)
    x, dy = x.to(dtype).requires_grad_(), dy.to(dtype)
    norm = nn.LayerNorm(96)
    with torch.no_grad():
        norm.weight.copy_(w), norm.bias.copy_(b)
    with torch.autocast('cpu', dtype=dtype):
        y = layer_norm(norm, x)
    assert y.dtype == dtype
    y.backward(dy)
    ey, _, _, edx, dx_mag, edw, edb, xh = _exact(x.detach(), w, b, dy)
    kk = (49152 + 2 * 96 + 16) * U_FP32
    assert ((norm.weight.grad.double() - edw).abs() <= kk * (dy.double().abs() * (xh.abs() + 1)).sum(0)).all()
    assert ((norm.bias.grad.double() - edb).abs() <= kk * dy.double().abs().sum(0)).all()
    u = U_BF16 if dtype == torch.bfloat16 else 2.0**-11
    k = (2 * 96 + 8) * U_FP32
    assert ((x.grad.double() - edx).abs() <= 4 * k * dx_mag + u * edx.abs()).all()
    y_tol = k * (xh.abs() + 1) * w.double().abs() + U_FP32 * b.double().abs() + u * ey.abs()
    assert ((y.double() - ey).abs() <= y_tol).all()


def test_nan_where_the_formulas_put_it(kernel):
    """A NaN in x makes its row of y and dx NaN and every column of the weight gradient NaN; a NaN in dy its row of
    dx and its column of both gradients: as the fp32 formulas (PyTorch's fp32 LayerNorm on the widened map)."""
    x, w, b, dy = _inputs(6, 40)
    x[2, 5], dy[4, 7] = float('nan'), float('nan')
    y, mean, rstd = lk.layer_norm_bf16(x, w, b, 1e-5)
    dx, dw, db = lk.layer_norm_grad_bf16(dy, x, mean, rstd, w)
    x32 = x.float().requires_grad_()
    w32, b32 = w.clone().requires_grad_(), b.clone().requires_grad_()
    y32 = F.layer_norm(x32, (40, ), w32, b32, 1e-5)
    y32.backward(dy.float())
    for got, want in ((y, y32), (dx, x32.grad), (dw, w32.grad), (db, b32.grad)):
        assert torch.equal(got.isnan(), want.isnan())
    assert y[2].isnan().all() and not y[[0, 1, 3, 4, 5]].isnan().any() and dw.isnan().all() and db[7].isnan()


def test_where_the_plain_module_runs(kernel, monkeypatch):
    """fp32, fp16 and strided maps at inference, a module with forward or backward hooks, ``torch.func`` transforms,
    an unaffine norm: ``norm(x)`` itself, the same bits; a contiguous bf16 map at inference: the kernel's forward
    without statistics, within one bf16 step of PyTorch's mixed-type LayerNorm (the same fp32 formula rounded once, up
    to summation order); a bias alone to train: the kernel; a strided bf16 map in training: the widened fallback (fp32
    gradients), not the kernel."""
    x, w, b, _ = _inputs(300, 48)
    norm = nn.LayerNorm(48)
    with torch.no_grad():
        norm.weight.copy_(w), norm.bias.copy_(b)
    calls, plain_kernel = [], lk.layer_norm_bf16
    monkeypatch.setattr(lk, 'layer_norm_bf16', lambda *a, **k: calls.append(k) or plain_kernel(*a, **k))
    with torch.no_grad():
        got, ref = layer_norm(norm, x), norm(x)
        assert calls == [{'stats': False}] and got.dtype == torch.bfloat16
        assert ((got.float() - ref.float()).abs() <= 2 * U_BF16 * ref.float().abs() + 1e-6).all()  # one bf16 step
        for other in (x.half(), x.float(), x.t().contiguous().t()):
            assert torch.equal(layer_norm(norm, other), norm(other))
    assert len(calls) == 1
    x32 = x.float().requires_grad_()
    assert layer_norm(norm, x32).grad_fn.name() == norm(x32).grad_fn.name()
    xr = x.clone().requires_grad_()
    assert layer_norm(norm, xr).grad_fn.name() == '_KernelLayerNormBackward'
    calls = []
    handle = norm.register_forward_hook(lambda *a: calls.append(1))
    layer_norm(norm, xr)
    handle.remove()
    assert calls == [1]
    handle = norm.register_full_backward_hook(lambda *a: calls.append(2))
    layer_norm(norm, xr).float().sum().backward()
    handle.remove()
    assert calls == [1, 2]  # a backward hook runs too: the module was called
    norm.weight.requires_grad_(False)  # only the bias trains: still the fp32 sums
    assert layer_norm(norm, x).grad_fn.name() == '_KernelLayerNormBackward'
    norm.weight.requires_grad_(True)
    got = torch.func.grad(lambda t: layer_norm(norm, t).float().sum())(x.float().bfloat16())
    assert got.shape == x.shape  # torch.func transforms run the module, which they can differentiate
    plain = nn.LayerNorm(48, elementwise_affine=False)
    assert torch.equal(layer_norm(plain, xr), plain(xr))
    strided = xr.t().contiguous().t()  # the same values, column-major
    out = layer_norm(norm, strided)
    assert out.grad_fn.name() != '_KernelLayerNormBackward' and out.dtype == torch.bfloat16
    ref = layer_norm(norm, xr).detach()  # the same fp32 formula rounded once, up to summation order: one bf16 step
    assert ((out.detach().float() - ref.float()).abs() <= 2 * U_BF16 * ref.float().abs() + 1e-6).all()


def test_swin_layer_norm_gradients_under_bf16_autocast():
    """A Swin-T training step under bf16 autocast (2 x 256 x 384): every LayerNorm's weight and bias gradient within
    the bf16-against-fp32 bound of the fp32 step's, relative to its largest entry (PyTorch's mixed-type backward was
    off by up to 66% here)."""
    from mmplugin.models.backbones.swin import SwinTransformer
    torch.manual_seed(0)
    m = SwinTransformer(arch='tiny', drop_path_rate=0.0).train()
    x = torch.randn(2, 3, 256, 384)

    def grads(bf16):
        m.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
            outs = m(x)
        g = torch.Generator().manual_seed(1)
        sum((o.float() * torch.randn(o.shape, generator=g)).sum() for o in outs).backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if 'norm' in n}
    low, ref = grads(True), grads(False)
    worst = max(((low[n] - ref[n]).abs().max() / ref[n].abs().max()).item() for n in ref)
    assert worst <= BF16_VS_FP32
