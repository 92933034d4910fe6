"""The plugin's RoIAlign (:mod:`mmplugin.ops.roi_align`) against the formulation (``roi_align_reference`` of
test_mmcv_kernels.py) in float64 and against mmcv's compiled kernel in fp32, with bounds from the summation error of
each side; non-finite values reach the same outputs and gradients as in mmcv's kernel; what the kernel does not cover
is mmcv's own function; configs build mmdet's extractor around it."""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from test_mmcv_kernels import _cases, roi_align_reference

from mmplugin.ops import build
from mmplugin.ops import roi_align as fast
from mmplugin.testing.numeric import U_FP32, U_FP64

HAS_MMCV_EXT = importlib.util.find_spec('mmcv._ext') is not None
needs_mmcv = pytest.mark.skipif(not HAS_MMCV_EXT, reason='mmcv without compiled ops')
# (output size, spatial scale, sampling ratio, aligned): adaptive and fixed grids, both coordinate conventions, a
# non-square output
SETTINGS = [((7, 7), 0.5, 0, True), ((3, 5), 1.0, 2, True), ((3, 3), 0.25, 0, False), ((2, 4), 1.0, 1, False)]


def _mmcv(x, rois, out_hw, scale, sampling, pool_mode='avg', aligned=True):
    from mmcv.ops import roi_align
    return roi_align(x, rois, out_hw, scale, sampling, pool_mode, aligned)


def _forward_backward(fn, x, rois, out_hw, scale, sampling, aligned, g=None):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, rois, out_hw, scale, sampling, aligned=aligned)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=x.dtype) if g is None else g
    out.backward(g)
    return out.detach(), x.grad, g


def _random_case(dtype=torch.float32, n=2, c=5, h=23, w=31, k=40, seed=0):
    """RoIs of 0.2 to 60 map pixels at scale 1/4, some reaching past the border, some below one pixel."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen, dtype=dtype)
    xy = torch.rand(k, 2, generator=gen, dtype=dtype) * torch.tensor([w * 4 + 40, h * 4 + 40], dtype=dtype) - 20
    wh = torch.rand(k, 2, generator=gen, dtype=dtype) ** 2 * 240 + 0.8
    idx = torch.randint(n, (k, 1), generator=gen).to(dtype)
    return x, torch.cat([idx, xy, xy + wh], 1)


def _grid_cells(rois, out_hw, scale, sampling):
    """The largest gh * gw of the RoIs (samples per bin)."""
    if sampling > 0:
        return sampling * sampling
    size = (rois[:, 3:5] - rois[:, 1:3]).double() * scale
    return int(max(math.ceil(float(s[1]) / out_hw[0]) * math.ceil(float(s[0]) / out_hw[1]) for s in size) or 1)


@pytest.mark.numeric
@pytest.mark.parametrize('out_hw,scale,sampling,aligned', SETTINGS)
def test_equals_the_formulation_in_float64(out_hw, scale, sampling, aligned):
    """Forward and input gradient equal the formulation to float64 rounding, on boxes past the border and below one
    pixel, two images."""
    x, rois = _cases()
    out, grad, g = _forward_backward(fast.roi_align, x, rois, out_hw, scale, sampling, aligned)
    xr = x.clone().requires_grad_(True)
    ref = roi_align_reference(xr, rois, out_hw, scale, sampling, aligned)
    (ref * g).sum().backward()
    n = 4 * _grid_cells(rois, out_hw, scale, sampling) + len(rois) * out_hw[0] * out_hw[1]
    tol = 4 * n * U_FP64 * float(x.abs().max()) * max(1.0, float(g.abs().max()))
    assert (out - ref.detach()).abs().max() <= tol
    assert (grad - xr.grad).abs().max() <= tol


@pytest.mark.numeric
@needs_mmcv
@pytest.mark.parametrize('out_hw,scale,sampling,aligned', SETTINGS)
def test_fp32_equals_mmcv_within_summation_error(out_hw, scale, sampling, aligned):
    """fp32 against mmcv's fp32 kernel: each side's error against the float64 result is at most (terms + 2) units
    of fp32 rounding times the sum of the magnitudes it adds; that sum is the float64 pass over |input| (forward) or
    |grad_out| (backward), all weights being non-negative."""
    x, rois = _random_case()
    ours, ours_grad, g = _forward_backward(fast.roi_align, x, rois, out_hw, scale, sampling, aligned)
    theirs, theirs_grad, _ = _forward_backward(_mmcv, x, rois, out_hw, scale, sampling, aligned, g)
    mag = _mmcv(x.abs().double(), rois.double(), out_hw, scale, sampling, aligned=aligned)
    xm = x.double().requires_grad_(True)
    _mmcv(xm, rois.double(), out_hw, scale, sampling, aligned=aligned).backward(g.abs().double())
    terms = 4 * _grid_cells(rois, out_hw, scale, sampling)
    assert ((ours.double() - theirs.double()).abs() <= 2 * (terms + 2) * U_FP32 * mag + 1e-30).all()
    # a map position gathers at most every sample of every RoI
    grad_terms = terms * len(rois) * out_hw[0] * out_hw[1]
    assert ((ours_grad.double() - theirs_grad.double()).abs() <= 2 * (grad_terms + 2) * U_FP32 * xm.grad + 1e-30).all()
    # and far tighter than the bound where it matters: no index is off
    assert (ours - theirs).abs().max() <= 1e-5 * float(x.abs().max())
    assert (ours_grad - theirs_grad).abs().max() <= 1e-4 * float(xm.grad.max())


@pytest.mark.numeric
@needs_mmcv
@pytest.mark.parametrize('aligned', [True, False])
def test_non_finite_values_reach_the_same_outputs_as_mmcv(aligned):
    """NaN and inf in the map (the corner every out-of-range sample reads, a border, the interior) and in the output
    gradient give NaN / inf at exactly the outputs and input positions where mmcv's kernel has them."""
    x, rois = _random_case(c=3, k=30, seed=1)
    x[0, 0, 0, 0] = float('nan')
    x[1, 1, 5, -1] = float('inf')
    x[0, 2, 11, 13] = float('-inf')
    x[1, 0, -1, 7] = float('nan')
    reached = set()
    for out_hw, scale, sampling, _ in SETTINGS:
        g = torch.randn(len(rois), 3, *out_hw)
        g[3:9, 1, 0, 0] = float('nan')
        g[7, 2, -1, -1] = float('inf')
        ours, ours_grad, _ = _forward_backward(fast.roi_align, x, rois, out_hw, scale, sampling, aligned, g)
        theirs, theirs_grad, _ = _forward_backward(_mmcv, x, rois, out_hw, scale, sampling, aligned, g)
        for a, b in ((ours, theirs), (ours_grad, theirs_grad)):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
            assert torch.equal(a[a.isinf()], b[b.isinf()])
            finite = a.isfinite()
            assert (a[finite] - b[finite]).abs().max() <= 1e-4 * max(1.0, float(b[finite].abs().max()))
        reached |= {'output'} if ours.isnan().any() else set()
        reached |= {'gradient'} if ours_grad.isnan().any() else set()
    assert reached == {'output', 'gradient'}  # the cases do reach both


def test_bad_input_is_refused_with_a_clear_error():
    x, rois = _random_case(k=4)
    bad = rois.clone()
    bad[1, 3] = bad[1, 1] - 1  # x2 < x1: mmcv refuses it too (aligned)
    with pytest.raises(ValueError, match='negative or NaN width'):
        fast.roi_align(x, bad, 7, 0.25, 0, 'avg', True)
    nan_box = rois.clone()
    nan_box[0, 2] = float('nan')
    with pytest.raises(ValueError, match='negative or NaN width'):
        fast.roi_align(x, nan_box, 7, 0.25, 0, 'avg', True)
    other = rois.clone()
    other[2, 0] = 2  # a batch of two images
    with pytest.raises(ValueError, match=r'batch indices must be integers in \[0, 2\)'):
        fast.roi_align(x, other, 7, 0.25)
    with pytest.raises(ValueError, match=r'\(K, 5\)'):
        fast.roi_align(x, rois[:, :4], 7, 0.25)
    with pytest.raises(ValueError, match=r'\(N, C, H, W\)'):
        fast.roi_align(x[0], rois, 7, 0.25)
    with pytest.raises(ValueError, match='pool_mode'):
        fast.RoIAlign(7, pool_mode='sum')(x, rois)
    with pytest.raises(ValueError, match='empty feature map'):
        fast.roi_align(x[:, :, :0], rois, 7, 0.25)


def test_legacy_roi_of_nan_size_gives_nan():
    """aligned=False: mmcv's grid size for a NaN box is undefined behaviour; here its outputs are NaN and it adds
    nothing to the input gradient; the other RoIs are untouched."""
    x, rois = _random_case(k=5)
    bad = rois.clone()
    bad[2, 3] = float('nan')
    out, grad, g = _forward_backward(fast.roi_align, x, bad, (7, 7), 0.25, 0, False)
    keep = [0, 1, 3, 4]
    ref, ref_grad, _ = _forward_backward(fast.roi_align, x, rois[keep], (7, 7), 0.25, 0, False, g[keep])
    assert out[2].isnan().all() and torch.equal(out[keep], ref)
    assert torch.equal(grad, ref_grad)


@needs_mmcv
@pytest.mark.parametrize('aligned', [True, False])
def test_degenerate_rois_match_mmcv(aligned):
    """Infinite coordinates (legacy mode clamps the size to 1 as mmcv does), a point box on a map narrower than the
    output (no samples), and a box of 1e12 pixels (mmcv's grid overflows to no samples on x86): the same outputs and
    gradients as mmcv's kernel."""
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).view(1, 2, 4, 4)
    rows = [[0, 1, 1, 2.5, 3], [0, 0.5, 0.5, 0.5, 0.5], [0, 0, 0, 1e12, 1e12]]
    if not aligned:
        rows += [[0, 1, 1, float('-inf'), 3], [0, float('inf'), 1, 2, 3]]
    rois = torch.tensor(rows)
    for out_hw, sampling in (((7, 7), 0), ((14, 14), 0), ((2, 2), 2)):
        ours, ours_grad, g = _forward_backward(fast.roi_align, x, rois, out_hw, 1.0, sampling, aligned)
        theirs, theirs_grad, _ = _forward_backward(_mmcv, x, rois, out_hw, 1.0, sampling, aligned, g)
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-5) and torch.allclose(ours_grad, theirs_grad, atol=1e-5)


@pytest.mark.numeric
def test_threads_split_channels_without_changing_a_bit():
    """The channel slices on 1 and on 3 threads give bit-identical outputs and gradients (no shared sums)."""
    x, rois = _random_case(c=7)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            results.append(_forward_backward(fast.roi_align, x, rois, (7, 7), 0.25, 0, True))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@needs_mmcv
def test_a_forked_child_runs_the_threaded_kernel():
    """The thread pool does not survive fork(): a child process (a pre-forking server, a data loader worker) starts
    its own."""
    import signal
    x, rois = _random_case(c=6)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = fast.roi_align(x, rois, 7, 0.25)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            signal.alarm(60)
            os._exit(0 if torch.equal(fast.roi_align(x, rois, 7, 0.25), expected) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        torch.set_num_threads(before)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@needs_mmcv
def test_what_the_kernel_does_not_cover_is_mmcv_function(monkeypatch):
    """Max pooling and graphs being compiled run mmcv's kernel (bit-identical); bf16 maps (CPU autocast) are pooled
    in fp32 and rounded back, as mmplugin.engine.mmcv_ops runs mmcv's kernel there."""
    from mmcv.ops import RoIAlign as MmcvRoIAlign
    x, rois = _random_case(k=6)
    layer = fast.RoIAlign(7, 0.25, 0, pool_mode='max')
    assert isinstance(layer, MmcvRoIAlign)  # what mmdeploy's TensorRT rewriter of the extractor checks
    assert torch.equal(layer(x, rois), _mmcv(x, rois, (7, 7), 0.25, 0, 'max'))
    assert not fast.fast_kernel_applies(x, rois, 'max') and fast.fast_kernel_applies(x, rois, 'avg')
    xb = x.bfloat16().requires_grad_(True)
    out = fast.roi_align(xb, rois, 7, 0.25)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, fast.roi_align(xb.detach().float(), rois, 7, 0.25).bfloat16())
    out.float().sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and xb.grad.abs().sum() > 0
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True)
    assert not fast.fast_kernel_applies(x, rois)
    assert torch.equal(fast.RoIAlign(7, 0.25)(x, rois), _mmcv(x, rois, (7, 7), 0.25, 0))


def test_kernel_builds_once_per_source_and_falls_back_without_a_compiler(tmp_path, monkeypatch):
    """A build lands in the cache directory (readable by all) and is reused, a damaged one is rebuilt; without a
    compiler the layer warns once, does not try to build again, and computes mmcv's function."""
    monkeypatch.setenv('MMPLUGIN_KERNEL_CACHE', str(tmp_path / 'kernels'))
    build.load_kernels.cache_clear()
    try:
        build.load_kernels('roi_align')
        built = list((tmp_path / 'kernels').glob('roi_align-*.so'))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        build.load_kernels.cache_clear()
        build.load_kernels('roi_align')
        assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
        assert built[0].stat().st_mode & 0o755 == 0o755
        built[0].write_bytes(b'not a library')
        # in a fresh process: this one would reuse the library it has loaded from that path
        subprocess.run([sys.executable, '-c', 'from mmplugin.ops.build import load_kernels; load_kernels("roi_align")'],
                       check=True, timeout=300, env={**os.environ, 'MMPLUGIN_KERNEL_CACHE': str(tmp_path / 'kernels')})
        assert built[0].stat().st_size > 1000 and not list((tmp_path / 'kernels').glob('*.tmp'))
        with pytest.raises(build.KernelUnavailable, match='no kernel source'):
            build.load_kernels('no_such_kernel')
        build.load_kernels.cache_clear()
        monkeypatch.setenv('CC', 'no-such-compiler-anywhere')
        monkeypatch.setenv('MMPLUGIN_KERNEL_CACHE', str(tmp_path / 'empty'))
        monkeypatch.setattr(fast, '_warned', [])
        attempts = []
        monkeypatch.setattr(fast, 'load_kernels', lambda name: attempts.append(name) or build.load_kernels(name))
        x, rois = _random_case(k=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            out = fast.roi_align(x, rois, 7, 0.25)
            fast.roi_align(x, rois, 7, 0.25)
        assert attempts == ['roi_align']
        assert [str(w.message) for w in caught].count(
            "mmplugin.RoIAlign uses mmcv's kernel: no C compiler ('no-such-compiler-anywhere' is not on PATH; set CC)"
        ) == 1
        if HAS_MMCV_EXT:
            assert torch.equal(out, _mmcv(x, rois, (7, 7), 0.25, 0))
    finally:
        build.load_kernels.cache_clear()


def test_configs_build_mmdet_extractors_around_the_plugin_layer():
    """``mmplugin.SingleRoIExtractor`` is mmdet's class with the plugin's layer per level; mmcv layer names pass
    through; an unknown plugin name is refused; ``use_mmcv_roi_align`` swaps the layers back."""
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor

    from mmplugin.models.roi_extractors import use_mmcv_roi_align
    from mmplugin.registry import MODELS
    cfg = dict(type='mmplugin.SingleRoIExtractor', out_channels=8, featmap_strides=[4, 8],
               roi_layer=dict(type='mmplugin.RoIAlign', output_size=7, sampling_ratio=0))
    ext = MODELS.build(cfg)
    assert type(ext) is SingleRoIExtractor
    assert [type(m) for m in ext.roi_layers] == [fast.RoIAlign] * 2 and ext.roi_layers[1].spatial_scale == 0.125
    plain = MODELS.build(dict(cfg, roi_layer=dict(type='RoIAlign', output_size=7)))
    assert type(plain.roi_layers[0]).__module__.startswith('mmcv.ops')
    with pytest.raises(KeyError, match='mmplugin.RoIPool'):
        MODELS.build(dict(cfg, roi_layer=dict(type='mmplugin.RoIPool', output_size=7)))
    feats = [torch.randn(1, 8, 24, 32), torch.randn(1, 8, 12, 16)]
    rois = torch.tensor([[0, 4.0, 4.0, 60.0, 50.0], [0, 10.0, 2.0, 120.0, 90.0]])
    ours = ext(feats, rois)
    assert use_mmcv_roi_align(ext) == 2 and type(ext.roi_layers[0]).__module__.startswith('mmcv.ops')
    if HAS_MMCV_EXT:
        assert torch.allclose(ext(feats, rois), ours, rtol=0, atol=1e-5)


def test_detector_configs_use_the_plugin_layer():
    """The shipped Mask R-CNN / Cascade / HTC++ configs pool RoIs with mmplugin.RoIAlign in every extractor."""
    from mmplugin.apis import load_config
    for name, keys in (('swin/swin_t_maskrcnn_1x_coco.py', ('bbox', 'mask')),
                       ('swin/swin_t_cascade_maskrcnn_3x_coco.py', ('bbox', 'mask')),
                       ('swin/swin_b_htcpp_6x_coco.py', ('bbox', 'mask', 'semantic')),
                       ('swiftformer/swiftformer_l1_maskrcnn_1x_coco.py', ('bbox', 'mask'))):
        head = load_config(f'configs/{name}').model.roi_head
        for key in keys:
            ext = head[f'{key}_roi_extractor']
            assert ext.type == 'mmplugin.SingleRoIExtractor' and ext.roi_layer.type == 'mmplugin.RoIAlign', name
