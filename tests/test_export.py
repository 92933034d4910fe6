"""Deployment: dynamic-shape ONNX export with onnxruntime parity, and torch.compile without graph breaks.

Tiny custom archs keep every capture short; the window machinery, padding and shift masks are the same code as
at full size. Parity is checked at sizes unlike the export size: not divisible by 32 or by the window, maps
smaller than a window, batch 1 and 3. References are PyTorch eager (itself tested against the official
formulation and mmdet in test_swin.py / test_swiftformer.py).
"""
from __future__ import annotations

import math
import os.path as osp
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mmplugin import deploy  # noqa: E402
from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2  # noqa: E402
from mmplugin.models.layers.window_attention import WindowGeometry  # noqa: E402

from conftest import BF16_VS_FP32, FP32_PARITY, randomize_  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SWIN_ARCH = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])
EXAMPLE = (2, 3, 96, 128)  # the capture size; every size below differs from it
PARITY_SHAPES = [
    (1, 3, 97, 131),  # not divisible by 4, 32 or the window
    (3, 3, 61, 75),  # batch 3
    (1, 3, 20, 28),  # stage-1 map 5x7: smaller than the window at every stage
    (3, 3, 7, 9),  # a single patch row at the last stages
    (1, 3, 224, 160),  # divisible by 32, several windows per stage
    (2, 3, 33, 300),  # very wide
]
TOL = FP32_PARITY  # onnxruntime fp32 vs eager fp32: the same function, other kernels (conftest)


def _tiny(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == 'swin':
        m = SwinTransformer(SWIN_ARCH, drop_path_rate=0.)
    elif family == 'swinv2':
        m = SwinTransformerV2(SWIN_ARCH, window_size=8, drop_path_rate=0.)
    else:
        m = SwiftFormer(dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48]), drop_path_rate=0.)
    return randomize_(m, seed=1).eval()  # random norms / biases too, so parity cannot pass by accident


# ---------------------------------------------------------------------------------------------------- geometry
def _reference_partition(x, ws, shift):
    """Official chain: pad bottom/right, roll by -shift, cut ws x ws windows (window-major, row-major inside)."""
    b, h, w, c = x.shape
    x = F.pad(x, (0, 0, 0, (-w) % ws, 0, (-h) % ws))
    hp, wp = x.shape[1:3]
    x = torch.roll(x, (-shift, -shift), (1, 2))
    return x.view(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)


@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 40), w=st.integers(1, 40), ws=st.integers(1, 9), shifted=st.booleans(),
       b=st.integers(1, 3))
def test_window_geometry_matches_official_partition(h, w, ws, shifted, b):
    """The closed-form gather indices (the same function eager caches and graphs compute) equal roll + partition,
    and reverse inverts partition exactly, for any size including maps smaller than the window."""
    shift = ws // 2 if shifted else 0
    x = torch.randn(b, h, w, 3)
    geom = WindowGeometry(h, w, ws, shift, x.device)
    win = geom.partition(x)
    assert torch.equal(win, _reference_partition(x, ws, shift))
    assert torch.equal(geom.reverse(win, b), x)
    if shift:  # the mask separates exactly the positions whose official region labels differ
        img = torch.zeros(1, geom.hp, geom.wp, 1)
        cnt = 0
        for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                img[:, hs, wsl, :] = cnt
                cnt += 1
        lab = img.view(1, geom.hp // ws, ws, geom.wp // ws, ws, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws)
        official = (lab[:, :, None] != lab[:, None, :]).float() * -100.0
        assert torch.equal(geom.mask, official)


# ---------------------------------------------------------------------------------------------------- ONNX
@pytest.fixture(scope='module')
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('onnx')


@pytest.mark.numeric
@pytest.mark.slow
@pytest.mark.parametrize('family', ['swin', 'swinv2', 'swiftformer'])
def test_backbone_onnx_dynamic_parity(family, onnx_dir):
    model = _tiny(family)
    path = str(onnx_dir / f'{family}.onnx')
    names = deploy.export_onnx(deploy.ExportPart(model, 'backbone'), path, torch.randn(*EXAMPLE))
    assert names == ['out0', 'out1', 'out2', 'out3']
    import onnx
    graph = onnx.load(path).graph
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert isinstance(dims[0], str) and dims[1] == 3 and all(isinstance(d, str) for d in dims[2:]), dims
    errs = deploy.onnx_parity(model, path, PARITY_SHAPES)
    assert max(errs.values()) <= TOL, errs


@pytest.mark.numeric
@pytest.mark.slow
def test_segmentor_onnx_dynamic_parity(onnx_dir):
    """Semantic FPN (mmseg) with a tiny Swin: logits at the input size, equal to eager at every size."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, 'configs/demo/swiftformer_xs_semfpn_shapes.py'))
    init_default_scope('mmseg')
    cfg.model.backbone = dict(type='mmplugin.SwinTransformer', arch=SWIN_ARCH, drop_path_rate=0.)
    cfg.model.neck.in_channels = [32, 64, 128, 256]
    cfg.model.neck.out_channels = 32
    cfg.model.decode_head.update(in_channels=[32] * 4, channels=16)
    torch.manual_seed(0)
    model = randomize_(MODELS.build(cfg.model), seed=2).eval()
    part = deploy.ExportPart(model, 'model')
    path = str(onnx_dir / 'semfpn.onnx')
    deploy.export_onnx(part, path, torch.randn(*EXAMPLE))
    errs = deploy.onnx_parity(part, path, PARITY_SHAPES)
    assert max(errs.values()) <= TOL, errs
    x = torch.randn(1, 3, 61, 75)
    with torch.no_grad():
        assert part(x)[0].shape == (1, 4, 61, 75)


@pytest.mark.numeric
@pytest.mark.slow
def test_upernet_onnx_dynamic_parity(onnx_dir):
    """UperNet (mmseg, pyramid pooling 1/2/3/6) with a tiny SwiftFormer: the adaptive pooling is rebuilt from the
    input's size in the graph (exported as is, onnxruntime fails or reads wrong positions at other sizes)."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, 'configs/swin_t_upernet_ade20k.py'))
    init_default_scope('mmseg')
    cfg.model.pop('auxiliary_head', None)
    cfg.model.backbone = dict(type='mmplugin.SwiftFormer', arch=dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48]),
                              drop_path_rate=0.)
    cfg.model.decode_head.update(in_channels=[16, 24, 32, 48], channels=16, num_classes=5,
                                 norm_cfg=dict(type='BN', requires_grad=True))
    torch.manual_seed(0)
    model = randomize_(MODELS.build(cfg.model), seed=3).eval()
    assert any(isinstance(m, torch.nn.AdaptiveAvgPool2d) for m in model.modules())
    part = deploy.ExportPart(model, 'model')
    assert not any(isinstance(m, torch.nn.AdaptiveAvgPool2d) for m in model.modules())
    path = str(onnx_dir / 'upernet.onnx')
    deploy.export_onnx(part, path, torch.randn(*EXAMPLE))
    errs = deploy.onnx_parity(part, path, PARITY_SHAPES)
    assert max(errs.values()) <= TOL, errs


@settings(max_examples=80, deadline=None)
@given(h=st.integers(1, 50), w=st.integers(1, 50), sh=st.one_of(st.none(), st.integers(1, 8)),
       sw=st.one_of(st.none(), st.integers(1, 8)))
def test_matrix_adaptive_pool_equals_pytorch(h, w, sh, sw):
    """The graph-friendly adaptive average pooling equals ``F.adaptive_avg_pool2d`` for any input / output size,
    including outputs larger than the input (overlapping windows) and ``None`` (size kept)."""
    x = torch.randn(2, 3, h, w, dtype=torch.float64)
    got = deploy._MatrixAdaptiveAvgPool2d((sh, sw))(x)
    ref = F.adaptive_avg_pool2d(x, (sh, sw))
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)


def test_export_part_errors():
    model = _tiny('swin')
    with pytest.raises(ValueError, match='part must be one of'):
        deploy.ExportPart(model, 'head')
    with pytest.raises(ValueError, match='has no neck'):
        deploy.ExportPart(model, 'backbone+neck')
    with pytest.raises(ValueError, match='example batch and sizes must be >= 2'):
        deploy.example_input(1, (224, 224))

    class TwoStage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.roi_head, self.bbox_head = model, torch.nn.Identity(), torch.nn.Identity()
    with pytest.raises(ValueError, match='mmdeploy'):
        deploy.ExportPart(TwoStage(), 'model')


def test_max_rel_error_nan_and_shape():
    ref = [torch.tensor([1.0, float('nan')])]
    assert deploy.max_rel_error([torch.tensor([1.0, float('nan')])], ref) == 0.0
    assert deploy.max_rel_error([torch.tensor([1.0, 2.0])], ref) == math.inf
    with pytest.raises(ValueError, match='shape'):
        deploy.max_rel_error([torch.zeros(3)], ref)


def test_export_cli_help():
    out = subprocess.run([sys.executable, 'tools/export.py', '--help'], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and '--part' in out.stdout
    out = subprocess.run([sys.executable, 'tools/export_mmdeploy.py', '--help'], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and '--deploy-cfg' in out.stdout


# ---------------------------------------------------------------------------------------------------- compile
COMPILE_SHAPES = [(2, 3, 96, 128), (1, 3, 97, 260), (3, 3, 33, 45), (1, 3, 230, 61), (3, 3, 61, 300),
                  (1, 3, 250, 129)]


@pytest.mark.parametrize('family', ['swin', 'swinv2', 'swiftformer'])
def test_compile_fullgraph_dynamic_one_recompile(family):
    """fullgraph=True (a graph break raises), dynamic=True: at most one recompile over six sizes (batch 1 and 3,
    non-divisible sizes), outputs equal to eager. Dynamo's capture is what decides graph breaks and recompiles;
    the 'eager' backend replays the captured graph without code generation, to keep the test short."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = _tiny(family)
    cnt = CompileCounterWithBackend('eager')
    compiled = deploy.compile_module(_tiny(family), backend=cnt)
    for shape in COMPILE_SHAPES:
        x = torch.randn(*shape)
        with torch.no_grad():
            got, ref = compiled(x), model(x)
        # eager SwiftFormer runs fused oneDNN kernels, the graph standard convs: equal up to summation order
        assert deploy.max_rel_error(got, ref) <= TOL, shape
    assert not counters['graph_break'], dict(counters['graph_break'])
    assert 1 <= cnt.frame_count <= 2, f'{cnt.frame_count - 1} recompiles'
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------- fast inference
def _tiny_detector():
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, 'configs/demo/swiftformer_xs_maskrcnn_shapes.py'))
    init_default_scope('mmdet')
    cfg.model.backbone.arch = dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48])
    cfg.model.neck.in_channels = [16, 24, 32, 48]
    torch.manual_seed(0)
    return randomize_(MODELS.build(cfg.model), seed=4).eval()


@pytest.mark.numeric
def test_fast_inference_backbone_neck_low_precision_heads_fp32(monkeypatch):
    """bf16 (forced, as on a CPU without native kernels): the backbone computes in bf16, the FPN maps reach the
    heads as fp32 within bf16's error, the whole Mask R-CNN predicts (mmcv RoIAlign / NMS run fp32)."""
    from mmdet.structures import DetDataSample
    model = _tiny_detector()
    x = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        ref = model.extract_feat(x)
    seen = []
    model.backbone.register_forward_hook(lambda m, i, o: seen.extend(t.dtype for t in o))
    monkeypatch.setattr(deploy, 'native_dtypes', lambda device='cpu': set())
    with pytest.warns(UserWarning, match='emulated'):
        assert deploy.enable_fast_inference(model, 'bf16') is torch.bfloat16
    with torch.no_grad():
        got = model.extract_feat(x)
    assert set(seen) == {torch.bfloat16}
    assert all(g.dtype == torch.float32 for g in got)
    err = deploy.max_rel_error(got, ref)
    assert FP32_PARITY < err < BF16_VS_FP32, err  # beyond fp32 rounding (bf16 really ran), within bf16's (conftest)
    meta = dict(img_shape=(96, 128), ori_shape=(96, 128), scale_factor=(1.0, 1.0), pad_shape=(96, 128),
                batch_input_shape=(96, 128))
    with torch.no_grad():
        out = model.predict(x, [DetDataSample(metainfo=meta), DetDataSample(metainfo=meta)])
    assert out[0].pred_instances.bboxes.dtype == torch.float32


def test_fast_inference_auto_follows_the_hardware(monkeypatch):
    model = _tiny_detector()
    plain = model.extract_feat
    monkeypatch.setattr(deploy, 'native_low_precision', lambda device='cpu': None)
    with pytest.warns(UserWarning, match='running fp32'):
        assert deploy.enable_fast_inference(model, 'auto') is None
    assert model.extract_feat == plain  # untouched: fp32 as before
    monkeypatch.setattr(deploy, 'native_low_precision', lambda device='cpu': torch.bfloat16)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # native: no warning
        assert deploy.enable_fast_inference(model, 'auto') is torch.bfloat16
    assert model.extract_feat != plain
    with pytest.raises(ValueError, match='must be one of'):
        deploy.enable_fast_inference(model, 'int8')
    with pytest.raises(TypeError, match='extract_feat'):
        deploy.enable_fast_inference(torch.nn.Linear(2, 2), 'bf16')


def test_native_low_precision_cpu_flags():
    """CPU: bf16 only where the processor has bf16 instructions (AVX512-BF16 / AMX); the reference is the kernel's
    own flag list, not torch."""
    flags = set()
    if osp.exists('/proc/cpuinfo'):
        for line in open('/proc/cpuinfo'):
            if line.startswith('flags'):
                flags |= set(line.split(':', 1)[1].split())
    if not flags:
        pytest.skip('no /proc/cpuinfo flags on this platform')
    if flags & {'avx512_bf16', 'amx_bf16'}:
        assert deploy.native_low_precision('cpu') is torch.bfloat16
    else:  # AVX2, and AVX512 without BF16: emulated bf16, so --fast auto stays fp32
        assert deploy.native_low_precision('cpu') is None and deploy.native_dtypes('cpu') == set()


# ---------------------------------------------------------------------------------------------------- mmdeploy
def _tiny_two_stage(config: str, seed: int = 0) -> torch.nn.Module:
    """A config's detector with a tiny backbone and 32-channel heads: default init (sane boxes), classification
    layers widened so that scores spread over (0, 1) and detections pass score_thr."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, 'configs', config))
    init_default_scope('mmdet')
    m = cfg.model
    if 'swin' in config:
        m.backbone.update(arch=SWIN_ARCH, drop_path_rate=0., init_cfg=None)
        m.neck.in_channels = [32, 64, 128, 256]
    else:
        m.backbone.update(arch=dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48]), init_cfg=None)
        m.neck.in_channels = [16, 24, 32, 48]
    m.neck.out_channels = m.rpn_head.in_channels = m.rpn_head.feat_channels = 32
    for key in ('bbox_roi_extractor', 'mask_roi_extractor'):
        m.roi_head[key].out_channels = 32
    for head in m.roi_head.bbox_head if isinstance(m.roi_head.bbox_head, list) else [m.roi_head.bbox_head]:
        head.update(in_channels=32, fc_out_channels=64, conv_out_channels=32, norm_cfg=None)
    for head in m.roi_head.mask_head if isinstance(m.roi_head.mask_head, list) else [m.roi_head.mask_head]:
        head.update(in_channels=32, conv_out_channels=32)
    torch.manual_seed(seed)
    model = MODELS.build(m)
    model.init_weights()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'rpn_cls' in name or 'fc_cls' in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


@pytest.mark.parametrize('config', [
    'swin_t_maskrcnn_1x.py',  # Swin V1: explicit SDPA scale (mmdeploy's rewriter got it wrong)
    pytest.param('swiftformer_xs_maskrcnn.py', marks=pytest.mark.slow),
    pytest.param('swin_t_cascade_maskrcnn_3x.py', marks=pytest.mark.slow),  # class-specific cascade regression
])
def test_mmdeploy_end2end_parity(config, tmp_path):
    """mmdeploy (onnxruntime, dynamic sizes, mmplugin.deploy.mmdeploy) against mmdet's predict: same detections
    (boxes within 1e-3 relative, same labels) and masks (IoU > 0.99) at sizes other than the export size."""
    pytest.importorskip('mmdeploy')
    from mmplugin.deploy.mmdeploy import end2end_parity, export_end2end
    model = _tiny_two_stage(config)
    path = export_end2end(model, osp.join(ROOT, 'configs/deploy/maskrcnn_onnxruntime_dynamic.py'),
                          torch.randn(1, 3, 96, 128), str(tmp_path / 'end2end.onnx'))
    sess = deploy.onnx_session(path)
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 3, 97, 131), (1, 3, 160, 224)]:
        r = end2end_parity(model, sess, torch.randn(*shape, generator=g))
        assert r['num_torch'] >= 5 and r['num_onnx'] == r['num_torch'] == r['matched'], (shape, r)
        # fp32 graphs on both sides (conftest.FP32_PARITY ~1e-4 on features); box decoding exponentiates the
        # regression deltas (x exp(d): a 1e-4 error in d stays ~1e-4, summed over a few boxes' coordinates), so
        # boxes get 10x the feature bound; masks are thresholded at 0.5, so a pixel can flip: IoU, not equality
        assert r['box_err'] <= 10 * FP32_PARITY and r['score_err'] <= FP32_PARITY and r['mask_iou'] > 0.99, (shape, r)
