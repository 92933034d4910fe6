"""Deployment: dynamic-shape ONNX export with onnxruntime parity, and mmdeploy end-to-end export.

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
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')
from conftest import FP32_PARITY, TINY_SWIN_ARCH, randomize_  # noqa: E402
from conftest import tiny_backbone as _tiny  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mmplugin import export  # noqa: E402
from mmplugin.export import exportable  # noqa: E402
from mmplugin.models.backbones.swin.attention import WindowGeometry  # noqa: E402
from mmplugin.utils.numerics import max_rel_error  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[2])
SWIN_ARCH = TINY_SWIN_ARCH
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
    names = export.export_onnx(export.ExportPart(model, 'backbone'), path, torch.randn(*EXAMPLE))
    assert names == ['out0', 'out1', 'out2', 'out3']
    import onnx
    graph = onnx.load(path).graph
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert isinstance(dims[0], str) and dims[1] == 3 and all(isinstance(d, str) for d in dims[2:]), dims
    errs = export.onnx_parity(model, path, PARITY_SHAPES)
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
    part = export.ExportPart(model, 'model')
    path = str(onnx_dir / 'semfpn.onnx')
    export.export_onnx(part, path, torch.randn(*EXAMPLE))
    errs = export.onnx_parity(part, path, PARITY_SHAPES)
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
    cfg = Config.fromfile(osp.join(ROOT, 'configs/swin/swin_t_upernet_160k_ade20k.py'))
    init_default_scope('mmseg')
    cfg.model.pop('auxiliary_head', None)
    cfg.model.backbone = dict(type='mmplugin.SwiftFormer', arch=dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48]),
                              drop_path_rate=0.)
    cfg.model.decode_head.update(in_channels=[16, 24, 32, 48], channels=16, num_classes=5,
                                 norm_cfg=dict(type='BN', requires_grad=True))
    torch.manual_seed(0)
    model = randomize_(MODELS.build(cfg.model), seed=3).eval()
    assert any(isinstance(m, torch.nn.AdaptiveAvgPool2d) for m in model.modules())
    part = export.ExportPart(model, 'model')
    assert not any(isinstance(m, torch.nn.AdaptiveAvgPool2d) for m in model.modules())
    path = str(onnx_dir / 'upernet.onnx')
    export.export_onnx(part, path, torch.randn(*EXAMPLE))
    errs = export.onnx_parity(part, path, PARITY_SHAPES)
    assert max(errs.values()) <= TOL, errs


@settings(max_examples=80, deadline=None)
@given(h=st.integers(1, 50), w=st.integers(1, 50), sh=st.one_of(st.none(), st.integers(1, 8)),
       sw=st.one_of(st.none(), st.integers(1, 8)))
def test_matrix_adaptive_pool_equals_pytorch(h, w, sh, sw):
    """The graph-friendly adaptive average pooling equals ``F.adaptive_avg_pool2d`` for any input / output size,
    including outputs larger than the input (overlapping windows) and ``None`` (size kept)."""
    x = torch.randn(2, 3, h, w, dtype=torch.float64)
    got = exportable._MatrixAdaptiveAvgPool2d((sh, sw))(x)
    ref = F.adaptive_avg_pool2d(x, (sh, sw))
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)


def test_export_part_errors():
    model = _tiny('swin')
    with pytest.raises(ValueError, match='part must be one of'):
        export.ExportPart(model, 'head')
    with pytest.raises(ValueError, match='has no neck'):
        export.ExportPart(model, 'backbone+neck')
    with pytest.raises(ValueError, match='example batch and sizes must be >= 2'):
        export.example_input(1, (224, 224))

    class TwoStage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.roi_head, self.bbox_head = model, torch.nn.Identity(), torch.nn.Identity()
    with pytest.raises(ValueError, match='mmdeploy'):
        export.ExportPart(TwoStage(), 'model')


def test_max_rel_error_nan_and_shape():
    ref = [torch.tensor([1.0, float('nan')])]
    assert max_rel_error([torch.tensor([1.0, float('nan')])], ref) == 0.0
    assert max_rel_error([torch.tensor([1.0, 2.0])], ref) == math.inf
    with pytest.raises(ValueError, match='shape'):
        max_rel_error([torch.zeros(3)], ref)


def test_export_cli_help():
    out = subprocess.run([sys.executable, 'tools/export.py', '--help'], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and '--part' in out.stdout
    out = subprocess.run([sys.executable, 'tools/export_mmdeploy.py', '--help'], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and '--deploy-cfg' in out.stdout


# ---------------------------------------------------------------------------------------------------- mmdeploy
def _tiny_two_stage(config: str, seed: int = 0) -> torch.nn.Module:
    """A config's detector with a tiny backbone and 32-channel heads: default init (sane boxes), classification
    layers widened so that scores spread over (0, 1) and detections pass score_thr."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
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
    # Swin V1: explicit SDPA scale (mmdeploy's own rewriter divides by it)
    pytest.param('swin/swin_t_maskrcnn_1x_coco.py', marks=pytest.mark.heavy),
    pytest.param('swiftformer/swiftformer_xs_maskrcnn_1x_coco.py', marks=pytest.mark.slow),
    # class-specific cascade regression
    pytest.param('swin/swin_t_cascade_maskrcnn_3x_coco.py', marks=pytest.mark.slow),
])
def test_mmdeploy_end2end_parity(config, tmp_path):
    """mmdeploy (onnxruntime, dynamic sizes, mmplugin.export.mmdeploy) against mmdet's predict: same detections
    (boxes within 1e-3 relative, same labels) and masks (IoU > 0.99) at sizes other than the export size."""
    pytest.importorskip('mmdeploy')
    from mmplugin.export.mmdeploy import end2end_parity, export_end2end
    model = _tiny_two_stage(config)
    path = export_end2end(model, osp.join(ROOT, 'configs/deploy/maskrcnn_onnxruntime_dynamic.py'),
                          torch.randn(1, 3, 96, 128), str(tmp_path / 'end2end.onnx'))
    sess = export.onnx_session(path)
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 3, 97, 131), (1, 3, 160, 224)]:
        r = end2end_parity(model, sess, torch.randn(*shape, generator=g))
        assert r['num_torch'] >= 5 and r['num_onnx'] == r['num_torch'] == r['matched'], (shape, r)
        # fp32 graphs on both sides (conftest.FP32_PARITY ~1e-4 on features); box decoding exponentiates the
        # regression deltas (x exp(d): a 1e-4 error in d stays ~1e-4, summed over a few boxes' coordinates), so
        # boxes get 10x the feature bound; masks are thresholded at 0.5, so a pixel can flip: IoU, not equality
        assert r['box_err'] <= 10 * FP32_PARITY and r['score_err'] <= FP32_PARITY and r['mask_iou'] > 0.99, (shape, r)
