"""Post-training static int8 (mmplugin.quantization.pt2e*): XNNPACK / ExecuTorch and onnxruntime.

Tiny SwiftFormer (random weights, random BatchNorm statistics and layer scales, so folding cannot pass by
accident), 64 px inputs. References are the fp32 eager model. The int8 bound: activations are quantised per
tensor to 256 levels over their calibrated range, weights per channel to 255 levels; one quantised layer adds a
rounding error of about step / sqrt(12) ~ range / 880, i.e. ~1 % of an activation's spread for a range of 8-10
standard deviations. The tiny model has ~15 quantised layers in a chain; independent errors add in quadrature, so
the output's relative rms error is ~ sqrt(15) * 1 % ~ 4 %, cosine ~ 1 - 0.04^2 / 2 ~ 0.999. The tests ask for
cosine >= 0.98 (relative rms error <= 20 %: five times the estimate, for calibration on 8 random images
and range outliers) and, so that they cannot pass on an unquantised graph, a max relative difference above fp32
rounding (1e-4).
"""
from __future__ import annotations

import copy
import importlib.util
import os.path as osp
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import randomize_

from mmplugin.models import SwiftFormer
from mmplugin.quantization import pt2e as Q

ROOT = str(Path(__file__).resolve().parents[2])
HAS_ET = importlib.util.find_spec('executorch') is not None and importlib.util.find_spec('torchao') is not None
HAS_ORT = importlib.util.find_spec('onnxruntime') is not None and importlib.util.find_spec('onnxscript') is not None
needs_et = pytest.mark.skipif(not HAS_ET, reason='executorch / torchao not installed (the edge extra: '
                              'pip install ".[edge]")')
needs_ort = pytest.mark.skipif(not HAS_ORT, reason='onnxruntime / onnxscript not installed')
ARCH = dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48])
SHAPE = (1, 3, 64, 64)
MIN_COSINE = 0.98  # module docstring
QUANTISED_DIFF = 1e-4  # above fp32 rounding: the graph really runs int8


class _Tuple(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return tuple(self.m(x))


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    m = randomize_(SwiftFormer(ARCH, drop_path_rate=0.), seed=1)
    for name, p in m.named_parameters():
        if 'layer_scale' in name:  # layer scales of the order of trained ones, so every branch counts
            p.data.uniform_(0.2, 0.6)
    return _Tuple(m).eval()


def _calib(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPE, generator=g) for _ in range(n)]


def _max_rel(a, b):
    from mmplugin.utils.numerics import max_rel_error
    return max_rel_error(a, b)


@pytest.mark.numeric
def test_int8_ready_keeps_the_numbers():
    """Folding and the token scores as a linear compute the eager model's function."""
    from mmplugin.models.backbones.swiftformer.attention import EfficientAdditiveAttention
    m = _tiny()
    ready = Q.int8_ready(m)
    assert any(type(s) is EfficientAdditiveAttention for s in m.modules())  # the original is unchanged
    assert not any(type(s) is EfficientAdditiveAttention for s in ready.modules())
    assert sum(isinstance(s, Q.Int8AdditiveAttention) for s in ready.modules()) == 4
    assert sum(isinstance(s, Q.L2Norm) for s in ready.modules()) == 3 * 4  # three per stage's attention
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        ref, got = m(x), ready(x)
    assert _max_rel(got, ref) < 1e-5  # fp32 rounding of a different summation order


def test_bad_options_are_clear_errors():
    from mmplugin.quantization.evaluate import build_int8_part, install_int8
    m = Q.int8_ready(_tiny())
    with pytest.raises(ValueError, match="'nope' is neither a preset"):
        Q.resolve_keep_float(m, ['attention_norm', 'nope'])
    with pytest.raises(ValueError, match='must be strings'):
        Q.resolve_keep_float(m, [3])
    types, names = Q.resolve_keep_float(m, ['attention', 'm.stem'])
    assert types == [Q.Int8AdditiveAttention] and names == ['m.stem']
    with pytest.raises(ValueError, match='backend must be one of'):
        build_int8_part(m, _calib(1), 'tflite', 'x.bin')
    with pytest.raises(ValueError, match='part must be one of'):
        install_int8(torch.nn.Module(), lambda x: x, 'model')


@needs_et
def test_quantize_pt2e_errors():
    m = Q.int8_ready(_tiny())
    with pytest.raises(ValueError, match='at least one calibration image'):
        Q.quantize_pt2e(m, [])
    with pytest.raises(ValueError, match='calibration image 1 has shape'):
        Q.quantize_pt2e(m, [torch.randn(SHAPE), torch.randn(1, 3, 32, 32)])


@needs_et
@pytest.mark.numeric
@pytest.mark.slow  # PT2E + lowering: ~100 s on 2 cores; XNNPACK's kernels do not follow the oneDNN / ATen ISA cap
def test_xnnpack_int8_export_runs_close_to_fp32(tmp_path):
    m = _tiny()
    calib = _calib()
    graph = Q.quantize_pt2e(Q.int8_ready(m), calib)
    path = Q.export_xnnpack(graph, calib[0], str(tmp_path / 'tiny.pte'))
    runner = Q.PteRunner(path, SHAPE)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = m(x)
    got = runner(x)
    assert Q.cosine(got, ref) >= MIN_COSINE
    assert _max_rel(got, ref) > QUANTISED_DIFF
    with pytest.raises(ValueError, match='takes input shape'):
        runner(torch.randn(1, 3, 32, 32))


@pytest.mark.heavy  # the quick tier keeps the onnxruntime and metric int8 paths
@needs_et
def test_kept_float_modules_stay_float_in_the_graph():
    """With the default, no L2Norm product is fed by a dequantize while the convolutions are; with 'none'
    the normalisations are quantised too; with 'attention' the attention's linears stay float."""
    ready = Q.int8_ready(_tiny())
    calib = _calib(2)
    default = Q.quantize_pt2e(ready, calib)
    f, q = Q.float_modules_in_graph(default, 'L2Norm')
    assert f > 0 and q == 0
    _, q_conv = Q.float_modules_in_graph(default, 'ConvEncoder')
    assert q_conv > 0
    f, q = Q.float_modules_in_graph(Q.quantize_pt2e(ready, calib, 'none'), 'L2Norm')
    assert q > 0
    f, q = Q.float_modules_in_graph(Q.quantize_pt2e(ready, calib, 'attention'), 'Int8AdditiveAttention')
    assert f > 0 and q == 0


@needs_ort
@pytest.mark.numeric
@pytest.mark.heavy  # the quick tier quantises through onnxruntime in the published-layout tool test
def test_onnxruntime_int8_close_to_fp32_and_float_nodes_excluded(tmp_path):
    import onnx

    from mmplugin.quantization.ort import OrtRunner, quantize_onnxruntime
    m = _tiny()
    ready = Q.int8_ready(m)
    info = quantize_onnxruntime(ready, _calib(), str(tmp_path / 'tiny.int8.onnx'))
    assert info['float_nodes']
    model = onnx.load(info['path'])
    producers = {o: n for n in model.graph.node for o in n.output}
    kept = [n for n in model.graph.node if n.name in set(info['float_nodes']) and n.op_type == 'Mul']
    assert kept
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def int8_pattern(n):  # every input dequantised and the output quantised: what onnxruntime fuses into int8
        deq_in = all(i in producers and producers[i].op_type == 'DequantizeLinear' for i in n.input)
        return deq_in and any(c.op_type == 'QuantizeLinear' for o in n.output for c in consumers.get(o, []))

    with mock.patch('mmplugin.quantization.ort.float_node_names', lambda *a: []):
        # the module metadata lost on the way: an error, not a model quantised where it was to stay float
        with pytest.raises(RuntimeError, match='no ONNX node carries their module metadata'):
            quantize_onnxruntime(ready, _calib(), str(tmp_path / 'lost.int8.onnx'))
    for n in kept:  # a kept node may read dequantised tensors of its producers but is not an int8 op itself
        assert not int8_pattern(n), n.name
    assert any(int8_pattern(n) for n in model.graph.node if n.op_type in ('Conv', 'MatMul', 'Gemm', 'Add'))
    assert any(n.op_type == 'QuantizeLinear' for n in model.graph.node)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = m(x)
    got = OrtRunner(info['path'])(x)
    assert Q.cosine(got, ref) >= MIN_COSINE
    assert _max_rel(got, ref) > QUANTISED_DIFF


def test_tool_rejects_bad_arguments(capsys):
    import mmplugin.cli.quantize as tool
    with pytest.raises(SystemExit):
        tool.parse_args(['c.py', 'w.pth', '--backend', 'tflite'])
    with pytest.raises(SystemExit):
        tool.parse_args(['c.py', 'w.pth', '--backend', 'xnnpack', '--num-calib', '0'])
    assert '--num-calib must be >= 1' in capsys.readouterr().err
    assert tool.main(['missing.py', 'w.pth', '--backend', 'xnnpack']) == 2
    assert 'config file not found' in capsys.readouterr().err


@needs_ort
@pytest.mark.numeric
@pytest.mark.heavy  # evaluate_int8 also runs in the published-layout tool test
def test_metric_path_scores_the_int8_model(tmp_path):
    """evaluate_int8 on a tiny Semantic FPN (random weights, 4 training / 3 validation images of 64 px): the int8
    backbone + neck really produced every scored prediction (3 images through it), both metric dicts come from
    the same evaluator, and mIoU moves by at most 10 points: with random weights many pixels sit on near-ties of
    the argmax, so an output cosine >= 0.98 (module docstring) can still flip a few per cent of the pixels."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmplugin.demo.synthetic import make_semantic_dataset
    from mmplugin.quantization.evaluate import evaluate_int8
    root = str(tmp_path / 'shapes_ade') + '/'
    make_semantic_dataset(root, num_train=4, num_val=3, size=64)
    config = osp.join(ROOT, 'configs/demo/swiftformer_xs_semfpn_shapes.py')
    loader = dict(num_workers=0, persistent_workers=False, dataset=dict(data_root=root))
    options = dict(model=dict(data_preprocessor=dict(size=(64, 64)), backbone=dict(arch=dict(_delete_=True, **ARCH)),
                              neck=dict(in_channels=ARCH['embed_dims'], out_channels=16),
                              decode_head=dict(in_channels=[16] * 4, channels=8)),
                   train_dataloader=loader, val_dataloader=loader, test_dataloader=loader)
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(copy.deepcopy(options))  # merging pops the _delete_ markers
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = randomize_(MODELS.build(cfg.model), seed=2)
    ckpt = str(tmp_path / 'tiny.pth')
    torch.save(dict(state_dict=model.state_dict()), ckpt)
    res = evaluate_int8(config, ckpt, backend='onnxruntime', num_calib=2, work_dir=str(tmp_path / 'work'),
                        cfg_options=options)
    assert res['int8_images'] == 3
    assert set(res['fp32']) == set(res['int8']) and 'mIoU' in res['fp32']
    assert abs(res['fp32']['mIoU'] - res['int8']['mIoU']) <= 10
    assert osp.isfile(res['path'])


def test_keep_float_default_follows_the_backend():
    """The default of each backend is the preset that held the 0.01 AP budget on every demo checkpoint measured
    (docs/int8.md); an explicit choice is kept as given, the CLI passes None when not told."""
    from mmplugin.cli.quantize import parse_args
    from mmplugin.quantization.pt2e import default_keep_float
    assert default_keep_float('xnnpack') == 'attention_norm'
    assert default_keep_float('onnxruntime') == 'attention'
    assert default_keep_float('onnxruntime', ['none']) == ['none']
    with pytest.raises(ValueError, match='backend'):
        default_keep_float('tensorrt')
    assert parse_args(['c.py', 'k.pth', '--backend', 'onnxruntime']).keep_float is None
    assert parse_args(['c.py', 'k.pth', '--backend', 'xnnpack', '--keep-float', 'none']).keep_float == ['none']


@pytest.mark.skipif(not HAS_ORT, reason='needs onnxruntime and onnxscript')
def test_tool_quantizes_a_published_layout_checkpoint(tmp_path, capsys):
    """tools/quantize.py on a whole-model file whose Swin backbone is in mmseg's published layout (``stages``,
    ``attn.w_msa``, ``ffn.layers``, unfold merge order): the tool's loading converts it, so the runner's model
    holds exactly the weights that were saved (a fit check alone would pass and a plain strict load would refuse
    the keys), and the int8 evaluation scores every validation image."""
    import json

    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmplugin.cli import quantize as quantize_tool
    from mmplugin.demo.synthetic import make_semantic_dataset
    from mmplugin.models.backbones.swin.converter import plugin_to_mmdet_swin
    from mmplugin.quantization.evaluate import _load_runner
    root = str(tmp_path / 'shapes_ade') + '/'
    make_semantic_dataset(root, num_train=4, num_val=3, size=64)
    config = tmp_path / 'tiny_swin_semfpn.py'
    config.write_text(
        f"_base_ = ['{ROOT}/configs/demo/swiftformer_xs_semfpn_shapes.py']\n"
        "model = dict(data_preprocessor=dict(size=(64, 64)),\n"
        "             backbone=dict(_delete_=True, type='mmplugin.SwinTransformer', window_size=4,\n"
        "                           drop_path_rate=0.0,\n"
        "                           arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])),\n"
        "             neck=dict(in_channels=[16, 32, 64, 128], out_channels=16),\n"
        "             decode_head=dict(in_channels=[16] * 4, channels=8))\n"
        f"_loader = dict(num_workers=0, persistent_workers=False, dataset=dict(data_root='{root}'))\n"
        "train_dataloader = _loader\nval_dataloader = _loader\ntest_dataloader = _loader\n")
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = randomize_(MODELS.build(Config.fromfile(str(config)).model), seed=3)
    own = model.state_dict()
    backbone = {k[len('backbone.'):]: v for k, v in own.items() if k.startswith('backbone.')}
    published = {**{'backbone.' + k: v for k, v in plugin_to_mmdet_swin(backbone).items()},
                 **{k: v for k, v in own.items() if not k.startswith('backbone.')}}
    assert 'backbone.stages.0.blocks.0.attn.w_msa.qkv.weight' in published  # really the published layout
    assert not set(published) >= set(own)
    ckpt = str(tmp_path / 'published.pth')
    torch.save(dict(state_dict=published), ckpt)

    loaded = _load_runner(str(config), ckpt, str(tmp_path / 'load'), None).model.state_dict()
    assert set(loaded) == set(own)
    assert all(torch.equal(loaded[k], v) for k, v in own.items())

    capsys.readouterr()
    rc = quantize_tool.main([str(config), ckpt, '--backend', 'onnxruntime', '--eval', '--num-calib', '2',
                             '--out', str(tmp_path / 'int8')])
    assert rc == 0
    out = capsys.readouterr().out
    res = json.loads(out[out.rindex('\n{') + 1:])  # the tool's JSON report closes its output
    assert res['int8_images'] == 3 and 'mIoU' in res['fp32'] and set(res['fp32']) == set(res['int8'])


def test_int8_attention_linears_are_exported_as_their_modules():
    """The quantiser's ``keep_float`` by module name or type matches a linear through the module stack of its exported
    node: the int8 attention calls its linears as modules (the model's own attention runs them through the fused
    ops, which record no module), so every linear node names its module, and the numbers stay the model's."""
    from mmplugin.models.backbones.swiftformer.attention import EfficientAdditiveAttention
    torch.manual_seed(0)
    attn = EfficientAdditiveAttention(8).eval()
    int8 = Q.Int8AdditiveAttention(attn).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.allclose(int8(x), attn(x), rtol=1e-5, atol=1e-6)
    graph = torch.export.export(int8, (x, ), strict=False).graph
    owners = set()
    for node in graph.nodes:
        if node.op == 'call_function' and node.target in (torch.ops.aten.linear.default, ):
            stack = list((node.meta.get('nn_module_stack') or {}).values())
            kind = stack[-1][1] if stack else None  # the module's class, or its qualified name
            kind = kind if isinstance(kind, str) or kind is None else f'{kind.__module__}.{kind.__qualname__}'
            assert kind == 'torch.nn.modules.linear.Linear', (node, stack)
            owners.add(stack[-1][0].split('.')[-1])
    assert owners == {'to_query', 'to_key', 'proj', 'final', 'token_score'}, owners
