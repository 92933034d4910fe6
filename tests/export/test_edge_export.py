"""Mobile runtimes: ExecuTorch (XNNPACK), LiteRT and Core ML exports of SwiftFormer parts, through
:mod:`mmplugin.export.backends`.

The export form (``prepare``: deploy folds, NCHW memory, the delegate-friendly normalisation) is checked against
eager and against ``F.normalize``; each installed runtime exports a tiny arch at a small fixed size and, where it runs
on this machine (ExecuTorch, LiteRT), matches eager within the fp32 parity bound. Core ML is checked structurally
(core MIL ops only, input / output shapes); it predicts on macOS only. A runtime that is not installed skips its
tests with the install command as the reason.
"""
from __future__ import annotations

import os.path as osp
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_PARITY, randomize_

from mmplugin.export import ExportPart, backends, flatten_outputs
from mmplugin.models import SwiftFormer
from mmplugin.models.backbones.swiftformer.attention import EfficientAdditiveAttention, l2_normalize
from mmplugin.utils.numerics import max_rel_error

ROOT = str(Path(__file__).resolve().parents[2])
TINY = dict(depths=[1, 1, 2, 1], embed_dims=[16, 16, 32, 32])
SIZE = (1, 3, 64, 96)  # fixed export shape: every stage has > 1 position, H != W


def _skip_unless(backend: str) -> None:
    reason = backends.available(backend)
    if reason:
        pytest.skip(reason)


def _tiny_backbone() -> SwiftFormer:
    torch.manual_seed(0)
    return randomize_(SwiftFormer(TINY), seed=1).eval()  # random BN statistics: the folds are exercised


def _tiny_segmentor() -> torch.nn.Module:
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, 'configs/demo/swiftformer_xs_semfpn_shapes.py'))
    init_default_scope('mmseg')
    cfg.model.backbone = dict(type='mmplugin.SwiftFormer', arch=TINY)
    cfg.model.neck.update(in_channels=TINY['embed_dims'], out_channels=16)
    cfg.model.decode_head.update(in_channels=[16] * 4, channels=16)
    torch.manual_seed(0)
    return randomize_(MODELS.build(cfg.model), seed=2).eval()


# ---------------------------------------------------------------------------------------------------- export form

@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-15), (torch.float32, 1e-6)])
def test_l2_normalize_equals_f_normalize(dtype, tol):
    """``x * rsqrt(max(C * mean x^2, eps^2))`` is ``F.normalize`` up to rounding, zero rows included (eps clamp)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, 24, generator=g, dtype=dtype) * torch.logspace(-8, 8, 24, dtype=dtype)
    x[0, 3] = 0
    assert max_rel_error([l2_normalize(x)], [F.normalize(x, dim=-1)]) <= tol
    assert torch.equal(l2_normalize(x)[0, 3], torch.zeros(24, dtype=dtype))
    scores = torch.randn(3, 50, 1, generator=g, dtype=dtype) * 1e4  # token scores, normalised over the tokens
    scores[1] = 0
    assert max_rel_error([l2_normalize(scores, dim=1)], [F.normalize(scores, dim=1)]) <= tol
    assert torch.equal(l2_normalize(scores, dim=1)[1], torch.zeros(50, 1, dtype=dtype))
    for bad, dim in ((x, 1), (x, 0), (x[0], -1)):  # over tokens only for (B, N, 1) scores; (B, N, C) only
        with pytest.raises(ValueError, match='l2_normalize takes'):
            l2_normalize(bad, dim=dim)


def _attention_reference(attn: EfficientAdditiveAttention, x: torch.Tensor) -> torch.Tensor:
    """Paper eq. 4-6 with F.normalize and one fused q / k projection (the formulation before the rewrite)."""
    c = x.shape[-1]
    qk = F.linear(x, torch.cat((attn.to_query.weight, attn.to_key.weight)),
                  torch.cat((attn.to_query.bias, attn.to_key.bias)))
    q, k = F.normalize(qk[..., :c], dim=-1), F.normalize(qk[..., c:], dim=-1)
    if attn.token_weighting == 'l2norm':
        a = F.normalize((q @ attn.w_g) * attn.scale, dim=1)
        g = (a * q).sum(1, keepdim=True)
    else:
        g = q.sum(1, keepdim=True)
    return attn.final(attn.proj(g * k) + q)


@pytest.mark.parametrize('weighting', ['l2norm', 'legacy_softmax'])
@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-14), (torch.float32, 1e-5)])
def test_attention_equals_fused_normalize_formulation(weighting, dtype, tol):
    torch.manual_seed(0)
    attn = EfficientAdditiveAttention(24, weighting).to(dtype).eval()
    x = torch.randn(2, 70, 24, dtype=dtype)
    with torch.no_grad():
        assert max_rel_error([attn(x)], [_attention_reference(attn, x)]) <= tol


def test_prepare_folds_to_constants_in_nchw_and_keeps_the_original():
    m = _tiny_backbone()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    d = backends.prepare(m)
    assert not any(isinstance(s, torch.nn.BatchNorm2d) for s in d.stages.modules())  # folded
    assert d.channels_last is False and m.channels_last is True
    assert all(p.is_contiguous() for p in d.parameters())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    x = torch.randn(*SIZE)
    with torch.no_grad():
        assert max_rel_error(d(x), m(x)) <= FP32_PARITY
        assert all(o.is_contiguous() for o in d(x))


# ---------------------------------------------------------------------------------------------------- errors

def test_clear_errors(tmp_path):
    m = _tiny_backbone()
    with pytest.raises(ValueError, match='backend must be one of'):
        backends.export(m, 'tensorrt', str(tmp_path / 'x'), torch.randn(*SIZE))
    for backend in backends.MOBILE_BACKENDS:  # checked before the runtime is needed: installed or not
        with pytest.raises(ValueError, match='>= 32'):
            backends.export(m, backend, str(tmp_path / 'x'), torch.randn(1, 3, 16, 64))
        with pytest.raises(ValueError, match='float32 image tensor'):
            backends.export(m, backend, str(tmp_path / 'x'), torch.randn(3, 64, 64))
        with pytest.raises(ValueError, match='fixed input shape'):
            backends.export_and_check(m, backend, str(tmp_path / 'x'), torch.randn(*SIZE), [(2, 3, 64, 96)])


def test_unknown_or_bad_options(tmp_path):
    m, x = _tiny_backbone(), torch.randn(*SIZE)
    with pytest.raises(ValueError, match='takes the options'):
        backends.export(m, 'coreml', str(tmp_path / 'x.mlpackage'), x, precison='fp32')
    with pytest.raises(ValueError, match='takes the options'):
        backends.export(m, 'executorch', str(tmp_path / 'x.pte'), x, precision='fp16')
    if backends.available('coreml') is None:
        with pytest.raises(ValueError, match='precision must be one of'):
            backends.export(m, 'coreml', str(tmp_path / 'x.mlpackage'), x, precision='int4')


def test_missing_runtime_names_the_install(monkeypatch, tmp_path):
    from mmplugin.export import executorch as et
    monkeypatch.setattr(et, 'missing', lambda: 'ExecuTorch is not usable: x; ' + et.INSTALL)
    with pytest.raises(backends.BackendUnavailable, match=r'mmplugin\[edge\]'):
        backends.export(_tiny_backbone(), 'executorch', str(tmp_path / 'x.pte'), torch.randn(*SIZE))


def test_export_cli_argument_errors():
    tool = osp.join(ROOT, 'tools', 'export.py')
    cfg = osp.join(ROOT, 'configs', 'demo', 'swiftformer_xs_semfpn_shapes.py')
    for extra, msg in ((['--backend', 'executorch', '--precision', 'fp32'], '--precision applies'),
                       (['--backend', 'litert', '--opset', '17'], '--opset applies')):
        out = subprocess.run([sys.executable, tool, cfg, '--out', 'x', *extra], capture_output=True, text=True)
        assert out.returncode == 2 and msg in out.stderr, out.stderr[-500:]
    out = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'edge_table.py'), '--rounds', '0'],
                         capture_output=True, text=True)
    assert out.returncode == 2 and '--rounds and --threads >= 1' in out.stderr, out.stderr[-500:]


class _Upsample(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return F.interpolate(x, mode='nearest', **self.kwargs)


@pytest.mark.numeric
@pytest.mark.parametrize('kwargs', [dict(scale_factor=2), dict(size=(18, 14)), dict(size=(6, 21)),
                                    dict(scale_factor=1), dict(size=(9, 10)), dict(scale_factor=1.5)])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_nearest_rewrite_is_bit_identical(kwargs, dtype):
    """The export-time rewrite of nearest upsampling (replication at integer factors; the original op otherwise)
    gives exactly ``F.interpolate``'s values, non-finite ones included, and leaves no nearest op behind at integer
    factors (XNNPACK has none)."""
    from mmplugin.export.rewrites import for_delegates
    x = torch.randn(2, 3, 6, 7, dtype=dtype)
    x[0, 1, 2, 3], x[1, 0, 5, 6], x[1, 2, 0, 0] = float('nan'), float('inf'), -0.0
    module = _Upsample(**kwargs)
    program = for_delegates(torch.export.export(module, (x, )))
    ops = {str(n.target) for n in program.graph.nodes if n.op == 'call_function'}
    out_hw = F.interpolate(x, mode='nearest', **kwargs).shape[-2:]
    integer = all(o % i == 0 for o, i in zip(out_hw, x.shape[-2:]))
    assert integer == (not any('upsample_nearest2d' in op for op in ops)), ops
    y = torch.randn_like(x)  # a second input: the program is not specialised to the example's values
    for inp in (x, y):
        got, want = program.module()(inp), module(inp)
        assert got.shape == want.shape
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))  # bitwise, +-inf included
        assert torch.equal(torch.signbit(got), torch.signbit(want))


# ---------------------------------------------------------------------------------------------------- runtimes

@pytest.mark.numeric
@pytest.mark.slow  # conversion: ~1-5 min on 2 shared cores
def test_executorch_segmentor_xnnpack_parity(tmp_path):
    """Whole Semantic FPN segmentor in one .pte and one XNNPACK segment (the neck's nearest upsampling rewritten),
    eager parity."""
    _skip_unless('executorch')
    part = ExportPart(_tiny_segmentor(), 'model').eval()
    info, errs = backends.export_and_check(part, 'executorch', str(tmp_path / 'seg.pte'), torch.randn(*SIZE))
    assert info['delegates'] == 1 and info['bytes'] > 0, info
    assert not any('upsample' in op or 'convolution' in op or op.startswith('aten.linear') or 'addmm' in op
                   for op in info['portable_ops']), info['portable_ops']  # no conv / GEMM left undelegated
    assert max(errs.values()) <= FP32_PARITY, errs


@pytest.mark.numeric
@pytest.mark.slow  # conversion: ~1-5 min on 2 shared cores
def test_litert_segmentor_parity(tmp_path):
    _skip_unless('litert')
    part = ExportPart(_tiny_segmentor(), 'model').eval()
    info, errs = backends.export_and_check(part, 'litert', str(tmp_path / 'seg.tflite'), torch.randn(*SIZE),
                                           threads=1)
    assert info['bytes'] > 0
    assert max(errs.values()) <= FP32_PARITY, errs


@pytest.mark.slow
def test_coreml_backbone_neck_program(tmp_path):
    """mlprogram converted here: core MIL ops only, fixed input shape, the eager output shapes and names."""
    _skip_unless('coreml')
    from mmplugin.export import coreml
    part = ExportPart(_tiny_segmentor(), 'backbone+neck').eval()
    x = torch.randn(*SIZE)
    path = str(tmp_path / 'bn.mlpackage')
    info, errs = backends.export_and_check(part, 'coreml', path, x, precision='fp32')
    with torch.no_grad():
        ref = flatten_outputs(part(x))
    assert info['inputs'] == {'input': SIZE}
    assert info['outputs'] == {f'out{i}': tuple(r.shape) for i, r in enumerate(ref)}
    assert info['ops'].get('conv', 0) >= 10 and not coreml.unsupported_ops(info['ops'])
    assert coreml.inspect(path)['outputs'] == info['outputs']
    if sys.platform != 'darwin':
        assert errs is None
        with pytest.raises(backends.BackendUnavailable, match='macOS'):
            backends.load('coreml', path)
    else:
        assert max(errs.values()) <= FP32_PARITY, errs


@pytest.mark.slow
def test_model_a_backend_cannot_take_is_a_clear_error(tmp_path):
    """Swin's relative-position gather does not convert to Core ML: the error names backend, model and size."""
    _skip_unless('coreml')
    from mmplugin.models import SwinTransformer
    torch.manual_seed(0)
    swin = SwinTransformer(dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2])).eval()
    with pytest.raises(backends.BackendExportError, match=r"coreml cannot convert SwinTransformer.*\(1, 3, 64, 96\)"):
        backends.export(swin, 'coreml', str(tmp_path / 'swin.mlpackage'), torch.randn(*SIZE))


def test_edge_table_rows_from_builders(tmp_path):
    """The table's hook: a row builder's runner is timed beside eager and checked against it (error computed)."""
    from mmplugin.analysis import bench
    seen = []

    def deployed_row(name, part, example, workdir):
        seen.append((name, tuple(example.shape), workdir))
        return [bench.Row('deploy form', backends.prepare(part), bytes=123),
                bench.Row('int8 (metric)', backends.prepare(part), metric='mIoU 1.0')]

    rows, notes = bench.measure('swiftformer_xs', size=64, rounds=1, threads=1, workdir=str(tmp_path),
                                runtimes=(), builders=[deployed_row])
    assert seen == [('swiftformer_xs', (1, 3, 64, 64), str(tmp_path))] and notes == []
    assert [r.runtime for r in rows] == ['eager fp32', 'deploy form', 'int8 (metric)']
    assert rows[0].rel_error == 0 and rows[1].rel_error <= FP32_PARITY and rows[2].rel_error is None
    assert all(r.ms > 0 for r in rows)
    text = bench.table({'swiftformer_xs': rows}, 64, 1, 1)
    assert 'CPU: ' in text and '| swiftformer_xs | int8 (metric) |' in text and 'mIoU 1.0' in text
    from mmplugin.inference import allocator
    assert ('freed memory retained' in text) == allocator.retained()
    with mock.patch.object(allocator, 'retained', lambda: True):  # --retain-memory's state is named in the header
        assert 'freed memory retained in the process' in bench.table({'swiftformer_xs': rows}, 64, 1, 1)
    with pytest.raises(ValueError, match='module:function'):
        bench.row_builder('no_colon')


def test_segmentor_breakdown_parts_add_up():
    """The per-part table covers the whole segmentor: the parts' MACs add up to the whole model's count (mmengine's
    analyzer on the exported 'model' part), and each part is timed."""
    from mmplugin.analysis import bench
    from mmplugin.analysis.breakdown import PARTS, breakdown_table, segmentor_breakdown
    from mmplugin.analysis.complexity import flop_analyzer
    res = segmentor_breakdown('swiftformer_xs_semfpn', size=64, rounds=1, threads=1)
    assert [r['part'] for r in res['rows']] == list(PARTS)
    whole = flop_analyzer(bench.build_part('swiftformer_xs_semfpn'), torch.randn(1, 3, 64, 64)).total()
    assert sum(r['gmacs'] for r in res['rows']) * 1e9 == pytest.approx(whole, rel=1e-12)
    assert all(r['ms'] > 0 and r['gmacs'] > 0 for r in res['rows']) and res['peak_gflops'] > 0
    assert 'swiftformer_xs_semfpn' in breakdown_table('swiftformer_xs_semfpn', res, 64, 1, 1)
    with pytest.raises(ValueError, match='segmentors'):
        segmentor_breakdown('swiftformer_xs')
