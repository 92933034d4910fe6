"""The fused window-attention kernel (``mmplugin.ops.window_attention``) against the float64 formulation
``softmax(scale * q k^T + pos + mask) v``: fp32 within a bound from the products' lengths, bf16 inputs within bf16
rounding, every vector ISA build (AVX-512, AVX2, generic), the strided views of a fused qkv projection, shift masks
shared image-major over a batch, non-finite values reaching exactly the outputs the formulation reaches, and the
cases it leaves to SDPA."""
from __future__ import annotations

import pytest
import torch
from conftest import isa_kernel
from torch._subclasses.fake_tensor import FakeTensorMode

from mmplugin.ops import build
from mmplugin.ops import window_attention as wa
from mmplugin.utils.numerics import rel_error

U_FP32 = 2.0**-24
U_BF16 = 2.0**-8


@pytest.fixture
def kernel():
    """The kernel needs the system C compiler; without one the model runs SDPA (tested below) and these skip."""
    if not wa.available():
        pytest.skip('the window-attention kernel cannot be built here (no C compiler)')


def reference(q, k, v, pos, mask, scale):
    """The formulation in float64: ``(B*nW, heads, N, d)`` -> ``(B*nW, N, heads * d)``."""
    bw, heads, n, d = q.shape
    s = (q.double() @ k.double().transpose(-1, -2)) * scale + pos.double().reshape(1, heads, n, n)
    if mask is not None:
        nw = mask.shape[0]
        s = (s.view(bw // nw, nw, heads, n, n) + mask.double()[None, :, None]).view(bw, heads, n, n)
    return (s.softmax(-1) @ v.double()).transpose(1, 2).reshape(bw, n, heads * d)


def qkv_views(bw, heads, n, d, seed=0, dtype=torch.float32):
    """q, k, v as views of a fused projection's output ``(B*nW, N, 3 * heads * d)``, as Swin's blocks make them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(bw, n, 3, heads, d, generator=g).to(dtype)
    return qkv.permute(2, 0, 3, 1, 4)


def shift_mask(nw, n, seed=0):
    """A shift mask like Swin's: -100 between tokens of different regions, 0 within one."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (nw, n), generator=g)
    return (labels[:, :, None] != labels[:, None, :]).float() * -100.0


def _bf16_bound(n, d, v, ref, isa=None):
    """bf16 operands: the fp32 bound and the output's rounding (:func:`_bound`), and in the AVX512_BF16 build (the
    one this process runs, or ``isa``; bf16 dot products) the softmax weights rounded to bf16 for the product with v:
    each weight within u, so each output within u * sum_t p_t |v_t| <= u * max|v|, relative to the output's largest
    magnitude."""
    if (isa or build.cpu_isa()) != 'AVX512_BF16' or d % 2:
        return _bound(n, d, torch.bfloat16)
    return _bound(n, d, torch.bfloat16) + U_BF16 * float(v.double().abs().max()) / float(ref.abs().max())


def _bound(n, d, dtype):
    """Relative to the output's largest magnitude, for scores of order one (unit-variance q, k, v at Swin's scale
    d^-0.5, a bias of a few units): the scores' d-term sums and the values' n-term sums each contribute at most their
    length times u, the exponentials and the division (a reciprocal and a product) a few u more (16). Larger scores
    scale the first term (the cosine test below). The bf16 inputs are exact in the float64 reference too, so bf16
    adds only the rounding of the output to nearest: at most bf16's unit roundoff 2^-8 of the largest magnitude."""
    fp32 = (d + n + 16) * U_FP32
    return fp32 if dtype == torch.float32 else fp32 + U_BF16


@pytest.mark.numeric
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('shape', [(12, 3, 49, 32, 4), (6, 2, 64, 32, 1), (4, 2, 144, 32, 2), (5, 3, 10, 5, 1),
                                   (3, 1, 1, 16, 1), (4, 2, 50, 24, 2), (3, 2, 3, 6, 1)])
def test_kernel_equals_the_formulation(shape, dtype, kernel):
    """Swin's 7x7 windows with a shift mask over a batch of 3 images, V2's 8x8 and 12x12 windows, a head dimension
    and a token count that fill no vector, a single-token window, and even head dimensions that are not a multiple
    of the vector width (the bf16 dot-product build's pair packing, its vector part and its tail)."""
    bw, heads, n, d, nw = shape
    q, k, v = qkv_views(bw, heads, n, d, seed=bw, dtype=dtype)
    pos = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(1)) * 2
    mask = shift_mask(nw, n) if nw > 1 else None
    with torch.no_grad():
        got = wa.window_attention(q, k, v, pos, mask, d**-0.5)
    assert got is not None and got.dtype == dtype and got.shape == (bw, n, heads * d)
    ref = reference(q, k, v, pos, mask, d**-0.5)
    bound = _bound(n, d, dtype) if dtype == torch.float32 else _bf16_bound(n, d, v, ref)
    assert rel_error(got.double(), ref) <= bound


def _cosine_case(dtype, rounded):
    """Swin V2's cosine attention on 6 windows of 64 tokens, 3 heads of 32 dims (logit scales 3, 10, 100, a zero q
    row and a zero k row, as padding tokens give), with its float64 reference and bound: ``(q, k, v, pos, mask, logit,
    ref, bound)``.

    ``rounded``: the bf16 dot-product build's operands, F.normalize(q) * logit and F.normalize(k) computed in fp32 and
    rounded to bf16 (as a bf16 matmul of F.normalize's fp32 output rounds them); the reference rounds them the same
    way. There q and k hold integers in [-8, 8], so their sums of squares are exact in any order and the fp32
    quotients are the kernel's to the bit: a quotient near a midpoint between two bf16 values cannot round the other
    way. Otherwise they are random, so that a rounding of the operands where none belongs shows."""
    import torch.nn.functional as F
    bw, heads, n, d = 6, 3, 64, 32
    q, k, v = (t.clone() for t in qkv_views(bw, heads, n, d, seed=9, dtype=dtype))
    if rounded:
        g = torch.Generator().manual_seed(10)
        q.copy_(torch.randint(-8, 9, q.shape, generator=g))
        k.copy_(torch.randint(-8, 9, k.shape, generator=g))
    q[0, :, 5] = 0
    k[1, :, 6] = 0
    logit = torch.tensor([3.0, 10.0, 100.0]).view(heads, 1, 1)
    pos, mask = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(4)), shift_mask(3, n)
    if rounded:
        norm = lambda x: (x.float()**2).sum(-1, keepdim=True).sqrt().clamp_min(1e-12)  # noqa: E731
        qn = (q.float() / norm(q) * logit).bfloat16().double()
        kn = (k.float() / norm(k)).bfloat16().double()
    else:
        qn = F.normalize(q.double(), dim=-1, eps=1e-12) * logit.double()
        kn = F.normalize(k.double(), dim=-1, eps=1e-12)
    ref = reference(qn, kn, v, pos, mask, 1.0)
    # the scores reach |logit| = 100 instead of about sqrt(d): their absolute rounding, which the softmax turns into
    # relative error of the weights, grows by up to 100 / sqrt(d)
    bound = _bound(n, d, torch.float32) * 100 / d**0.5
    if dtype == torch.bfloat16:  # the output's rounding; with bf16 products also the weights' (as _bf16_bound)
        bound += U_BF16 * (1 + (float(v.double().abs().max()) / float(ref.abs().max()) if rounded else 0))
    return q, k, v, pos, mask, logit, ref, bound


@pytest.mark.numeric
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_cosine_attention_equals_the_formulation(dtype, kernel):
    """Swin V2: q and k normalised inside the kernel as F.normalize does (a zero row, as a padding token's, stays
    zero through the 1e-12 floor) and q times its head's logit scale, against F.normalize in float64; bf16 in the
    AVX512_BF16 build with the normalised operands rounded to bf16 for its bf16 products (:func:`_cosine_case`)."""
    rounded = dtype == torch.bfloat16 and build.cpu_isa() == 'AVX512_BF16'
    q, k, v, pos, mask, logit, ref, bound = _cosine_case(dtype, rounded)
    with torch.no_grad():
        got = wa.window_attention(q, k, v, pos, mask, 1.0, logit)
    assert rel_error(got.double(), ref) <= bound


@pytest.mark.numeric
def test_cosine_attention_on_amx_tiles_or_vector_dot_products():
    """The AVX512_BF16 build's cosine attention multiplies the rounded normalised operands on AMX tiles where the
    process may use them, else with vdpbf16ps: both within the rounded-operand bound of :func:`_cosine_case`, and
    its fp32 entry (fp32 arithmetic throughout) within the unrounded one."""
    from mmplugin.utils.cpu import native_amx
    isa_kernel('window_attention', 'AVX512_BF16', 'mmplugin_window_attention_bf16', wa._ARGS)  # skips where not built
    lib = build.load_kernels('window_attention', 'AVX512_BF16')
    try:
        for dtype, suffix in ((torch.bfloat16, 'bf16'), (torch.float32, 'f32')):
            q, k, v, pos, mask, logit, ref, bound = _cosine_case(dtype, dtype == torch.bfloat16)
            bw, heads, n, d = q.shape
            cosine = logit.reshape(heads).contiguous()
            entry = isa_kernel('window_attention', 'AVX512_BF16', f'mmplugin_window_attention_{suffix}', wa._ARGS)
            for amx in (False, True) if native_amx() and dtype == torch.bfloat16 else (False, ):
                assert wa.set_amx(lib, amx) == amx
                out = torch.empty(bw, n, heads * d, dtype=dtype)
                assert entry(
                    q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                    pos.data_ptr(), mask.data_ptr(), cosine.data_ptr(), 3, heads, n, d, 1.0, out.data_ptr(), None,
                    None, 0, 2, 0, bw) == 0
                assert rel_error(out.double(), ref) <= bound, (dtype, amx)
    finally:
        wa.set_amx(lib, native_amx())


@pytest.mark.numeric
@pytest.mark.parametrize('value', [float('nan'), float('inf'), float('-inf'), -100.0])
@pytest.mark.parametrize('at', [(3, 7), (48, 48)])  # the last: beyond the whole vectors of 49 x 49 values
def test_one_entry_in_an_otherwise_zero_mask_window_counts(value, at, kernel):
    """A window whose mask is zero but for one entry takes that entry (a NaN or +inf gives its query row NaN, -inf
    or -100 drops that key from the row) exactly where the formulation does; the other windows are untouched."""
    bw, heads, n, d = 4, 2, 49, 32
    q, k, v = qkv_views(bw, heads, n, d, seed=5)
    pos, mask = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(6)), torch.zeros(2, n, n)
    mask[1, at[0], at[1]] = value
    with torch.no_grad():
        got = wa.window_attention(q, k, v, pos, mask, d**-0.5)
    ref = reference(q, k, v, pos, mask, d**-0.5)
    assert torch.equal(got.isnan(), ref.isnan()) and got.isnan().any() == (value != value or value == float('inf'))
    finite = ref.isfinite()
    assert rel_error(got.double()[finite], ref[finite]) <= _bound(n, d, torch.float32)
    dropped = reference(q, k, v, pos, None, d**-0.5)
    assert not torch.equal(ref[1, at[0]], dropped[1, at[0]]) and torch.equal(ref[0], dropped[0])


@pytest.mark.numeric
@pytest.mark.parametrize('shape', [(6, 3, 49, 32, 2), (4, 2, 64, 32, 1), (3, 2, 144, 64, 3), (2, 2, 10, 32, 1)])
def test_bf16_products_on_amx_tiles_or_vector_dot_products(shape):
    """The AVX512_BF16 build multiplies bf16 operands on AMX tiles where the process may use them (windows of at
    least 32 tokens, head dims of whole 32-value tiles; a 10-token window keeps the vector path) or with vdpbf16ps:
    either way within the bf16-operand bound of the float64 formulation (exact products summed in fp32, the softmax
    weights rounded to bf16), shift masks included, and a NaN key makes exactly its window's rows NaN; where the tiles
    decline, the switch changes no bit."""
    from mmplugin.utils.cpu import native_amx
    isa_kernel('window_attention', 'AVX512_BF16', 'mmplugin_window_attention_bf16', wa._ARGS)  # skips where not built
    lib = build.load_kernels('window_attention', 'AVX512_BF16')
    bw, heads, n, d, nw = shape
    q, k, v = qkv_views(bw, heads, n, d, seed=7, dtype=torch.bfloat16)
    k[0, 1, 5, 3] = float('nan')
    pos, mask = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(8)), shift_mask(nw, n)
    mask[0] = 0.0
    ref = reference(q, k, v, pos, mask, d**-0.5)
    finite = ref.isfinite()
    bound = _bf16_bound(n, d, v, ref[finite], 'AVX512_BF16')
    outs = []
    try:
        for amx in (False, True) if native_amx() else (False, ):
            assert wa.set_amx(lib, amx) == amx
            out = torch.empty(bw, n, heads * d, dtype=torch.bfloat16)
            assert lib.mmplugin_window_attention_bf16(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                pos.data_ptr(), mask.data_ptr(), None, nw, heads, n, d, d**-0.5, out.data_ptr(), None, None, 0, 2, 0,
                bw) == 0
            assert torch.equal(out.isnan(), ref.isnan()) and out[0, :, d:2 * d].isnan().all()
            assert rel_error(out.double()[finite], ref[finite]) <= bound
            outs.append(out.view(torch.int16))
    finally:
        wa.set_amx(lib, native_amx())
    if len(outs) == 2 and n < 32:
        assert torch.equal(outs[0], outs[1])


def test_the_amx_switch_changes_the_path():
    """The two paths add each pair of products in opposite orders (vdpbf16ps the odd element first, the tiles the
    even one), so over 300,000 outputs some bits differ where the tiles run: the switch takes effect."""
    from mmplugin.utils.cpu import native_amx
    if not native_amx():
        pytest.skip('this process may not use AMX tiles')
    isa_kernel('window_attention', 'AVX512_BF16', 'mmplugin_window_attention_bf16', wa._ARGS)
    lib = build.load_kernels('window_attention', 'AVX512_BF16')
    bw, heads, n, d = 64, 3, 49, 32
    q, k, v = qkv_views(bw, heads, n, d, seed=7, dtype=torch.bfloat16)
    pos = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(8))
    outs = []
    try:
        for amx in (False, True):
            assert wa.set_amx(lib, amx) == amx
            out = torch.empty(bw, n, heads * d, dtype=torch.bfloat16)
            assert lib.mmplugin_window_attention_bf16(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                pos.data_ptr(), None, None, 1, heads, n, d, d**-0.5, out.data_ptr(), None, None, 0, 2, 0, bw) == 0
            outs.append(out.view(torch.int16))
    finally:
        wa.set_amx(lib, native_amx())
    assert not torch.equal(outs[0], outs[1])


def test_amx_stays_off_under_a_cap_below_it(monkeypatch):
    """With ONEDNN_MAX_CPU_ISA below AMX (here AVX512_CORE_BF16), loading the kernels leaves the tiles off."""
    from mmplugin.utils.cpu import native_amx
    if not wa.available():
        pytest.skip('no window-attention kernel here')
    lib = wa._kernels()
    try:
        monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX512_CORE_BF16')
        monkeypatch.setattr(wa, '_amx_set', {})
        assert wa._kernels() is lib and wa._amx_set == {id(lib): False}
    finally:
        monkeypatch.undo()
        wa.set_amx(lib, native_amx())


@pytest.mark.numeric
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('isa', list(build.ISA_FLAGS))
def test_every_isa_build_computes_the_same_function(isa, dtype):
    """Each vector width (16, 8, 4 floats) is its own build, and AVX-512 with the bf16 dot products (bf16 operands
    multiplied two per lane) another; the CPU may only run the ones it supports."""
    fn = isa_kernel('window_attention', isa, f'mmplugin_window_attention_{wa._SUFFIX[dtype]}', wa._ARGS)
    bw, heads, n, d = 8, 3, 49, 32
    q, k, v = qkv_views(bw, heads, n, d, seed=3, dtype=dtype)
    pos, mask = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(2)), shift_mask(4, n)
    mask[0], mask[1] = 0.0, -0.0  # zero windows read the position bias alone, as most of a shifted map's do
    out = torch.empty(bw, n, heads * d, dtype=dtype)
    assert fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
              pos.data_ptr(), mask.data_ptr(), None, 4, heads, n, d, d**-0.5, out.data_ptr(), None, None, 0, 2,
              0, bw) == 0
    ref = reference(q, k, v, pos, mask, d**-0.5)
    bound = _bound(n, d, dtype) if dtype == torch.float32 else _bf16_bound(n, d, v, ref, isa)
    assert rel_error(out.double(), ref) <= bound


@pytest.mark.numeric
@pytest.mark.parametrize('masked', [False, True])
@pytest.mark.parametrize('where', ['q', 'k', 'v', 'pos'])
@pytest.mark.parametrize('value', [float('nan'), float('inf'), float('-inf')])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_nonfinite_values_reach_the_formulations_outputs(where, value, masked, dtype, kernel):
    """One non-finite entry: the outputs that are NaN, +inf or -inf are exactly the float64 formulation's. With a
    shift mask, an infinite value meets the masked keys' weights (exp of about -100: tiny in float64, subnormal or
    zero in fp32 depending on the exp implementation: torch's differ by ISA, the kernel flushes subnormals), so
    inf x weight is inf or NaN by precision: there the non-finite outputs are the formulation's, NaN or inf."""
    bw, heads, n, d = 4, 2, 49, 32
    q, k, v = (t.clone() for t in qkv_views(bw, heads, n, d, seed=5, dtype=dtype))
    pos = torch.randn(heads, n, n, generator=torch.Generator().manual_seed(6))
    mask = shift_mask(2, n) if masked else None
    target = dict(q=q, k=k, v=v, pos=pos)[where]
    target[(1, 1, 7, 3) if target.dim() == 4 else (1, 7, 3)] = value
    with torch.no_grad():
        got = wa.window_attention(q, k, v, pos, mask, d**-0.5)
    ref = reference(q, k, v, pos, mask, d**-0.5)
    tests = (torch.isnan, torch.isposinf, torch.isneginf)
    if masked and where == 'v' and abs(value) == float('inf'):
        tests = (torch.isfinite, )
    for test in tests:
        assert torch.equal(test(got), test(ref)), (where, value, test.__name__)
    finite = torch.isfinite(ref)
    bound = _bound(n, d, dtype) if dtype == torch.float32 else _bf16_bound(n, d, v[v.isfinite()], ref[finite])
    assert finite.any() and rel_error(got.double()[finite], ref[finite].double()) <= bound


def test_left_to_sdpa_where_it_does_not_apply():
    """Autograd, dropout, fp16 / float64, and mixed dtypes get None (the caller runs SDPA)."""
    q, k, v = qkv_views(2, 2, 49, 32)
    pos = torch.zeros(2, 49, 49)
    assert wa.window_attention(q.requires_grad_(), k, v, pos, None) is None  # grad mode on, a leaf needing grad
    q = q.detach()
    assert not wa.fast_kernel_applies(q, k, v, dropout=0.1)
    assert wa.window_attention(q.half(), k.half(), v.half(), pos, None) is None
    assert wa.window_attention(q.double(), k.double(), v.double(), pos, None) is None
    assert wa.window_attention(q, k, v.bfloat16(), pos, None) is None
    assert wa.window_attention(q, k, v, pos.to('meta'), None) is None  # memory the kernel cannot read
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
        assert wa.window_attention(fake, fake, fake, mode.from_tensor(pos), None) is None
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        assert wa.window_attention(fwAD.make_dual(q, torch.ones_like(q)), k, v, pos, None) is None
    if wa.available():
        with pytest.raises(ValueError, match='mask of shape'):
            wa.window_attention(q, k, v, pos, torch.zeros(3, 49, 49))


def test_map_rows_are_checked(kernel):
    """The kernel reads and writes through ``rows``: out-of-range, missing or repeated map rows are errors."""
    qkv, pad, pos = torch.zeros(1, 4, 6), torch.zeros(6), torch.zeros(1, 4, 4)
    for rows in ([[0, 1, 2, 9]], [[0, 1, 2, -1]], [[0, 1, 1, 3]], [[0, 1, 2, -2]]):
        with pytest.raises(ValueError, match='exactly once'):
            wa.map_window_attention(qkv, pad, torch.tensor(rows), 1, pos, None)
    good = wa.map_window_attention(qkv, pad, torch.tensor([[3, 1, 2, 0]]), 1, pos, None)
    assert good is not None and good.shape == (1, 4, 2)


def test_training_mode_dropout_never_takes_the_kernel():
    """Under no_grad in training mode (a teacher model), attention and projection dropout still apply: two calls
    differ, where the kernel (which has no dropout) would give the eval output twice."""
    from mmplugin.models.backbones.swin.attention import WindowAttention
    from mmplugin.models.backbones.swin.windows import WindowGeometry
    m = WindowAttention(32, 2, 7, attn_drop=0.5, proj_drop=0.5).train()
    x = torch.randn(1, 14, 14, 32)
    geom = WindowGeometry(14, 14, 7, 3, x.device)
    with torch.no_grad():
        a, b = m(x, geom), m(x, geom)
        m.eval()
        c = m(x, geom)
    assert not torch.equal(a, b) and not torch.equal(a, c)


def test_a_cache_that_cannot_be_written_falls_back(tmp_path, monkeypatch):
    """An unwritable kernel cache is a KernelUnavailable (the callers' fallback), not an error in the forward."""
    blocker = tmp_path / 'file'
    blocker.write_text('')
    monkeypatch.setenv('MMPLUGIN_KERNEL_CACHE', str(blocker / 'kernels'))
    build.load_kernels.cache_clear()
    try:
        with pytest.raises(build.KernelUnavailable, match='failed'):
            build.load_kernels('window_attention', 'DEFAULT')
    finally:
        build.load_kernels.cache_clear()


def test_threads_do_not_change_a_bit(kernel):
    """Windows are split over the OpenMP threads; each window's arithmetic is the same on any thread count."""
    q, k, v = qkv_views(24, 3, 49, 32, seed=7)
    pos, mask = torch.randn(3, 49, 49, generator=torch.Generator().manual_seed(3)), shift_mask(6, 49)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            with torch.no_grad():
                outs.append(wa.window_attention(q, k, v, pos, mask))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.numeric
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_map_layout_gathers_and_scatters_like_partition_and_reverse(dtype, kernel):
    """The map layout (windows read from the map's projection, padding tokens from the zero token's projection,
    outputs written back to the map) equals the float64 formulation on Swin's own partition and reverse: a 10x13
    map in 7x7 windows (padded to 14x14), shifted by 3, two images."""
    from mmplugin.models.backbones.swin.windows import WindowGeometry
    b, h, w, heads, d = 2, 10, 13, 2, 16
    c = heads * d
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(b, h * w, 3 * c, generator=g).to(dtype)
    pad = torch.randn(3 * c, generator=g).to(dtype)
    geom = WindowGeometry(h, w, 7, 3, torch.device('cpu'))
    pos = torch.randn(heads, 49, 49, generator=g)
    with torch.no_grad():
        got = wa.map_window_attention(qkv, pad, geom.map_rows(), heads, pos, geom.mask)
    # the reference: pad the map with the padding token's projection, partition, attend in float64, reverse
    padded = pad.double().expand(b, geom.hp, geom.wp, 3 * c).clone()
    padded[:, :h, :w] = qkv.double().view(b, h, w, 3 * c)
    win = padded.reshape(b, geom.hp * geom.wp, 3 * c).index_select(1, geom.fwd).view(-1, 49, 3, heads, d)
    q, k, v = win.permute(2, 0, 3, 1, 4)
    ref = geom._reverse(reference(q, k, v, pos, geom.mask, d**-0.5), b).reshape(b, h * w, c)
    assert got.shape == (b, h * w, c) and got.dtype == dtype
    bound = _bound(49, d, dtype) if dtype == torch.float32 else _bf16_bound(49, d, qkv[..., 2 * c:], ref)
    assert rel_error(got.double(), ref) <= bound


def test_the_kernel_isa_follows_the_caps(monkeypatch):
    """``MMPLUGIN_KERNEL_ISA`` lowers the build (never raises it; an unknown name is an error), and a oneDNN cap
    below AVX512_CORE_BF16 rules out the bf16 dot-product build."""
    monkeypatch.delenv(build.ISA_ENV, raising=False)
    natural = build.cpu_isa()
    order = list(build.ISA_FLAGS)
    for asked in order:
        monkeypatch.setenv(build.ISA_ENV, asked.lower())
        assert build.cpu_isa() == order[max(order.index(natural), order.index(asked))]
    monkeypatch.setenv(build.ISA_ENV, 'SSE9')
    with pytest.raises(ValueError, match=build.ISA_ENV):
        build.cpu_isa()
    monkeypatch.delenv(build.ISA_ENV)
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX512_CORE')
    assert build.cpu_isa() != 'AVX512_BF16'


def test_a_compiler_without_bf16_instructions_falls_back_to_avx512(monkeypatch):
    """Where ``-mavx512bf16`` does not build (older compilers), the AVX512 build serves, with a warning, instead of
    no kernel at all."""
    avx512 = object()

    def load(name, isa=None):
        if isa == 'AVX512_BF16':
            raise build.KernelUnavailable('unrecognized command-line option -mavx512bf16')
        return avx512
    monkeypatch.setattr(build, '_libraries', {})
    monkeypatch.setattr(build, 'cpu_isa', lambda: 'AVX512_BF16')
    monkeypatch.setattr(build, 'load_kernels', load)
    with pytest.warns(UserWarning, match='AVX512 build runs'):
        assert build.kernel_library('window_attention', {}, 'SDPA') is avx512
