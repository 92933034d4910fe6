"""SwiftFormer specifics: exactness against the official formulation, parameter counts, every weight layout,
deployment folding, drop-path schedule, norm configs. The shared backbone contract is in test_conformance.py."""
from __future__ import annotations

import re

import pytest
import torch
from conftest import DATA, FP32_PARITY, official_keys, random_state_dict, randomize_, rel_err

from mmplugin.checkpoint import CheckpointError
from mmplugin.models import SwiftFormer
from mmplugin.models.backbones.swiftformer import convert_swiftformer
from mmplugin.reference.swiftformer import ReferenceSwiftFormer

pytestmark = pytest.mark.numeric  # rerun on older CPU kernel families by tools/run_tests.sh

KEYS = DATA / 'official_keys_swiftformer.txt'
# Official fork_feat parameter counts (four output BatchNorms, no classifier), counted on the official code.
PARAMS = {'xs': 3_033_792, 's': 5_642_688, 'l1': 11_288_592, 'l3': 27_469_760}


def _reference(arch='xs', legacy=False, seed=0):
    s = SwiftFormer.arch_zoo[arch]
    return randomize_(ReferenceSwiftFormer(s['depths'], s['embed_dims'], legacy_softmax=legacy), seed).eval()


def _fresh_out_norms(ref):
    """The official stage outputs followed by fresh output norms (weight 1, bias 0, mean 0, var 1)."""
    for i in (0, 2, 4, 6):
        getattr(ref, f'norm{i}').reset_parameters()
        getattr(ref, f'norm{i}').reset_running_stats()
    return ref


def _official_classifier_sd(ref):
    sd = {k: v for k, v in ref.state_dict().items() if not re.match(r'norm[0246]\.', k)}
    c = ref.norm6.num_features
    sd.update({'norm.weight': torch.rand(c) + 0.5, 'norm.bias': torch.randn(c), 'norm.running_mean': torch.randn(c),
               'norm.running_var': torch.rand(c) + 0.5, 'norm.num_batches_tracked': torch.tensor(3),
               'head.weight': torch.randn(1000, c), 'head.bias': torch.randn(1000),
               'dist_head.weight': torch.randn(1000, c), 'dist_head.bias': torch.randn(1000)})
    return sd


@pytest.mark.parametrize('arch', ['xs', 's', 'l1', 'l3'])
def test_param_count_equals_official_fork_feat(arch):
    assert sum(p.numel() for p in SwiftFormer(arch).parameters()) == PARAMS[arch]


@pytest.mark.parametrize('hw', [(224, 224), (227, 301), (513, 511), (33, 47)])
def test_shapes_any_size(hw):
    model = SwiftFormer('xs').eval()
    outs = model(torch.rand(2, 3, *hw))
    h, w = hw
    for i, (o, c) in enumerate(zip(outs, [48, 56, 112, 220])):
        s = 2**(i + 2)
        assert o.shape == (2, c, -(-h // s), -(-w // s))
        assert o.is_contiguous(), 'downstream mmcv ops need contiguous NCHW'
    assert model.out_channels == [48, 56, 112, 220] and model.out_strides == [4, 8, 16, 32]


def test_shapes_match_official_key_list_table():
    text = KEYS.read_text()
    model = SwiftFormer('xs').eval()
    for m in re.finditer(r'fork_feat \((\d+), (\d+)\) (\[.*\])', text):
        outs = model(torch.rand(1, 3, int(m.group(1)), int(m.group(2))))
        assert str([tuple(o.shape) for o in outs]) == m.group(3)


@pytest.mark.parametrize('legacy', [False, True])
@pytest.mark.parametrize('hw', [(250, 330), (224, 224)])
def test_exact_against_official_formulation(legacy, hw):
    ref = _fresh_out_norms(_reference('xs', legacy))
    model = SwiftFormer('xs', token_weighting='legacy_softmax' if legacy else 'l2norm').eval()
    sd, _ = convert_swiftformer(ref.state_dict())
    model.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        want, got = ref(x), model(x)
    for a, b in zip(got, want):
        assert rel_err(a, b) < FP32_PARITY
    # the two weight generations really differ, so the option matters
    other = SwiftFormer('xs', token_weighting='l2norm' if legacy else 'legacy_softmax').eval()
    other.load_state_dict(sd)
    with torch.no_grad():
        assert rel_err(other(x)[3], want[3]) > 10 * FP32_PARITY  # beyond rounding


def test_exact_in_train_mode_too():
    ref = _fresh_out_norms(_reference('xs')).train()
    model = SwiftFormer('xs').train()
    model.load_state_dict(convert_swiftformer(ref.state_dict())[0])
    x = torch.randn(2, 3, 96, 128)
    for a, b in zip(model(x), ref(x)):
        assert rel_err(a, b) < FP32_PARITY


@pytest.mark.parametrize('prepack', [True, False])
def test_switch_to_deploy_equal(prepack):
    """The deployed form computes the official formulation's outputs, without BatchNorms or layer scales; with
    ``prepack`` (default) its linear / 1x1 weights are frozen and the forward runs on their packed copies."""
    from mmplugin.models.layers import prepack as packing
    ref = _fresh_out_norms(_reference('xs'))
    model = SwiftFormer('xs').eval()
    model.load_state_dict(convert_swiftformer(ref.state_dict())[0])
    x = torch.randn(1, 3, 250, 330)
    try:
        with torch.no_grad():
            want = ref(x)
            assert model.switch_to_deploy(prepack=prepack) is model
            got = model(x)
        assert not any(isinstance(m, torch.nn.BatchNorm2d) for n, m in model.named_modules()
                       if n.startswith('stages'))
        assert not any('layer_scale' in n for n, _ in model.named_parameters())
        for a, b in zip(got, want):
            assert rel_err(a, b) < FP32_PARITY
        ids = {id(p) for p in model.parameters()}
        packed = {key for key, _ in packing._PACKED if key in ids}
        if prepack and packing._AVAILABLE:
            pointwise = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)]
            assert packing.frozen_count(model) >= len(pointwise) > 20
            assert {id(m.weight) for m in pointwise} <= packed  # every pointwise conv ran on its packed copy
        else:
            assert packing.frozen_count(model) == 0 and not packed
    finally:
        packing.release_prepacked(model)
    with pytest.raises(RuntimeError, match='eval'):
        SwiftFormer('xs').train().switch_to_deploy()
    with pytest.raises(TypeError, match='prepack must be True or False'):
        SwiftFormer('xs').eval().switch_to_deploy(prepack='yes')


# ------------------------------------------------------------------------------------------------ weights
def _check_all_arrived(model, ref_sd, skip=(), copy_classifier_norm=False):
    """Every official parameter arrived at its converted place, value for value."""
    conv, _ = convert_swiftformer(dict(ref_sd), copy_classifier_norm=copy_classifier_norm)
    msd = model.state_dict()
    n = 0
    for k, v in conv.items():
        assert torch.equal(msd[k], v.reshape(msd[k].shape)), k
        n += 1
    body = [k for k in msd if not re.match(r'norm\d\.', k)]
    assert all(k in conv for k in body)
    return n


@pytest.mark.parametrize('copy_norm', [False, True])
def test_official_key_list_loads_every_parameter(tmp_path, copy_norm):
    shapes = official_keys(KEYS, 'Full key list: SwiftFormer_XS')
    assert len(shapes) == 316
    sd = random_state_dict(shapes)
    path = tmp_path / 'SwiftFormer_XS.pth'
    torch.save(sd, path)
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path)), copy_classifier_norm=copy_norm)
    model.init_weights()
    msd = model.state_dict()
    # spot-check the mapping by name, then everything via the converter
    assert torch.equal(msd['stem.0.weight'], sd['patch_embed.0.weight'])
    assert torch.equal(msd['stages.1.downsample.proj.weight'], sd['network.1.proj.weight'])
    assert torch.equal(msd['stages.3.blocks.3.attn.proj.weight'], sd['network.6.3.attn.Proj.weight'])
    classifier_norm = [k for k in sd if k.startswith('norm.')]
    assert len(classifier_norm) == 5
    if copy_norm:  # the classifier norm -> the last output norm
        assert torch.equal(msd['norm3.running_var'], sd['norm.running_var'])
        assert _check_all_arrived(model, sd, copy_classifier_norm=True) == len(shapes) - 4  # heads dropped
    else:  # ignored, as the official fork_feat loader does: norm3 starts fresh
        assert torch.equal(msd['norm3.running_var'], torch.ones(220))
        assert torch.equal(msd['norm3.bias'], torch.zeros(220))
        assert _check_all_arrived(model, sd) == len(shapes) - 4 - len(classifier_norm)


@pytest.mark.parametrize('container', ['raw', 'model', 'state_dict', 'module', 'backbone'])
def test_containers_and_prefixes(tmp_path, container):
    ref = _reference('xs', seed=3)
    sd = _official_classifier_sd(ref)
    if container == 'model':
        obj = {'model': sd, 'epoch': 3}
    elif container == 'state_dict':
        obj = {'state_dict': sd}
    elif container == 'module':
        obj = {'model': {'module.' + k: v for k, v in sd.items()}}
    elif container == 'backbone':
        obj = {'state_dict': {**{'backbone.' + k: v for k, v in sd.items()}, 'neck.w': torch.zeros(1)}}
    else:
        obj = sd
    path = tmp_path / 'ckpt.pth'
    torch.save(obj, path)
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    _check_all_arrived(model, sd)


def test_fork_feat_checkpoint_and_exactness(tmp_path):
    ref = _reference('xs', seed=4)
    path = tmp_path / 'fork.pth'
    torch.save({'model': ref.state_dict()}, path)
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    model.eval()
    x = torch.randn(1, 3, 130, 150)
    with torch.no_grad():
        for a, b in zip(model(x), ref(x)):
            assert rel_err(a, b) < FP32_PARITY


def _to_timm(sd):
    """Official -> timm layout, written from timm's documented mapping (anchors.md §3.4)."""
    out = {}
    for k, v in sd.items():
        k = k.replace('patch_embed.', 'stem.').replace('dist_head.', 'head_dist.').replace('attn.Proj.', 'attn.proj.')
        m = re.match(r'network\.(\d+)\.(.*)', k)
        if m:
            n = int(m.group(1))
            k = f'stages.{n // 2}.blocks.{m.group(2)}' if n % 2 == 0 else f'stages.{n // 2 + 1}.downsample.{m.group(2)}'
        if re.search(r'layer_scale(_\d)?$', k):
            k, v = k + '.gamma', v.reshape(-1)
        out[k] = v
    return out


def test_timm_layout(tmp_path):
    ref = _reference('xs', seed=5)
    sd = _official_classifier_sd(ref)
    path = tmp_path / 'timm.pth'
    torch.save(_to_timm(sd), path)
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    _check_all_arrived(model, sd)


def test_plugin_layout_roundtrip(tmp_path):
    model = randomize_(SwiftFormer('xs'), seed=6)
    path = tmp_path / 'plugin.pth'
    torch.save({'state_dict': model.state_dict()}, path)
    other = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    other.init_weights()
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k


def test_wrong_arch_and_family_and_corrupt(tmp_path):
    sd = _official_classifier_sd(_reference('xs'))
    path = tmp_path / 'xs.pth'
    torch.save(sd, path)
    model = SwiftFormer('s', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r"shape mismatch for '.*': checkpoint \(.*\) vs model \(.*\).*arch"):
        model.init_weights()
    # same widths, other depths: nothing silently half-loaded
    custom = SwiftFormer(dict(depths=[3, 3, 5, 4], embed_dims=[48, 56, 112, 220]),
                         init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    before = {k: v.clone() for k, v in custom.state_dict().items()}
    with pytest.raises(CheckpointError, match='unexpected'):
        custom.init_weights()
    assert all(torch.equal(before[k], v) for k, v in custom.state_dict().items()), 'partially loaded'
    swin = tmp_path / 'swin.pth'
    torch.save({'model': {'layers.0.blocks.0.attn.qkv.weight': torch.zeros(3, 3)}}, swin)
    with pytest.raises(CheckpointError, match='not a SwiftFormer checkpoint'):
        SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(swin))).init_weights()
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match='corrupt'):
        SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(bad))).init_weights()


def test_drop_path_schedule_only_on_attention_blocks():
    model = SwiftFormer('xs', drop_path_rate=0.2)
    total = sum(model.depths)
    seen = 0
    for stage in model.stages:
        for j, blk in enumerate(stage.blocks):
            expected = 0.2 * (seen + j) / (total - 1) if j == len(stage.blocks) - 1 else 0.0
            assert blk.drop_path.p == pytest.approx(expected)
        seen += len(stage.blocks)


@pytest.mark.parametrize('kwargs,match', [
    (dict(arch='xl'), r"unknown arch 'xl'.*\['l1', 'l3', 's', 'xs'\]"),
    (dict(arch=dict(depths=[1, 2, 3, 4])),
     r"needs exactly the keys \['depths', 'embed_dims'\]; missing \['embed_dims'\]"),
    (dict(arch=dict(depths=[1, 2, 3, 4], embed_dims=[8] * 4, dims=[8] * 4)), r"unknown \['dims'\]"),
    (dict(arch=dict(depths=[1, 2, 3], embed_dims=[8, 8, 8])), 'arch depths must be an int or a list of 4'),
    (dict(arch=dict(depths=[1, 2, 3, 4], embed_dims=[8, 8.5, 8, 8])), 'arch embed_dims must hold ints'),
    (dict(arch='xs', drop_path_rate=1.0), r'drop_path_rate must be a number in \[0, 1\)'),
    (dict(arch='xs', out_indices=(1, 1)), 'distinct'),
    (dict(arch='xs', out_indices=(4, )), 'out_indices'),
    (dict(arch='xs', frozen_stages=7), 'frozen_stages'),
    (dict(arch='xs', token_weighting='softmax'), 'token_weighting'),
])
def test_bad_construction(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SwiftFormer(**kwargs)


def test_norm_cfg_syncbn_and_gn_out_norms():
    model = SwiftFormer('xs', norm_cfg=dict(type='SyncBN'), out_norm_cfg=dict(type='GN', num_groups=1)).eval()
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.stages.modules())
    assert isinstance(model.norm0, torch.nn.GroupNorm)
    outs = model(torch.rand(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [48, 56, 112, 220]


@pytest.mark.parametrize('hw', [(96, 128), (192, 192)])  # 192: stage 1's 48 x 48 maps of 48 channels (C == H == W)
def test_training_gradients_equal_the_official_formulation(hw, monkeypatch):
    """A training step's parameter gradients (train-mode BatchNorms, layer scales, random weights) equal those of
    the official formulation run in float64 with the same weights, with every MLP's hidden map kept once
    (mmplugin.models.layers.recompute_conv) on the plugin's side: the gradients as a whole within fp32 parity, each
    parameter with a gradient that does not vanish in exact arithmetic within ten times it."""
    from mmplugin.models.backbones.swiftformer.blocks import ConvEncoder, ConvMlp
    from mmplugin.models.layers import recompute_conv
    calls = []
    fwd = recompute_conv._GeluConv1x1.forward
    monkeypatch.setattr(recompute_conv._GeluConv1x1, 'forward', staticmethod(lambda *a: calls.append(1) or fwd(*a)))
    ref = _fresh_out_norms(_reference('xs', seed=2)).double().train()
    model = SwiftFormer('xs').train()
    model.load_state_dict(convert_swiftformer(ref.state_dict())[0])
    x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(0))
    weights = [torch.randn(o.shape, dtype=torch.float64) for o in ref(x.double())]
    sum((o * w).sum() for o, w in zip(ref(x.double()), weights)).backward()
    sum((o * w.float()).sum() for o, w in zip(model(x), weights)).backward()
    assert len(calls) == sum(isinstance(m, (ConvEncoder, ConvMlp)) for m in model.modules()) > 16
    want = convert_swiftformer({k: p.grad for k, p in ref.named_parameters()})[0]
    got = {k: p.grad.double() for k, p in model.named_parameters()}
    assert set(got) == set(want)
    keys = sorted(got)
    assert rel_err(torch.cat([got[k].flatten() for k in keys]), torch.cat([want[k].flatten() for k in keys])) \
        <= FP32_PARITY
    # a conv bias right before a train-mode BatchNorm has no gradient in exact arithmetic (the mean removes it):
    # its float64 gradient is rounding noise, 1e-9 of the others' and below
    scale = max(w.norm() for w in want.values())
    for k in keys:
        if want[k].norm() > 1e-6 * scale:
            assert rel_err(got[k], want[k]) <= 10 * FP32_PARITY, k
