"""Swin V1/V2 specifics: any size, equality with mmdet's Swin and the official formulation, every weight layout,
V2 position-bias details. The shared backbone contract is in test_conformance.py."""
from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import DATA, FP32_PARITY, official_keys, random_state_dict, randomize_, rel_err

from mmplugin.checkpoint import CheckpointError
from mmplugin.models import SwinTransformer, SwinTransformerV2
from mmplugin.reference.swin import ReferenceSwin

pytestmark = pytest.mark.numeric  # rerun on older CPU kernel families by tools/run_tests.sh

KEYS = DATA / 'official_keys_swin.txt'
TINY = dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])
SMALL_ARCH = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])


def _pair(v2, arch=SMALL_ARCH, ws=7, pws=0, seed=0):
    cls = SwinTransformerV2 if v2 else SwinTransformer
    model = cls(arch, window_size=ws, drop_path_rate=0.0, **({'pretrained_window_size': pws} if v2 else {}))
    randomize_(model, seed)
    ref = ReferenceSwin(arch['embed_dims'], arch['depths'], arch['num_heads'], ws, v2, pws).eval()
    ref.load_state_dict(model.state_dict(), strict=True)
    return model.eval(), ref


# ------------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize('v2', [False, True])
@pytest.mark.parametrize('ws,hw', [(7, (250, 330)), (12, (410, 300)), (7, (20, 28)), (7, (13, 9)), (8, (64, 64))])
def test_equal_to_official_formulation(v2, ws, hw):
    model, ref = _pair(v2, ws=ws)
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        for a, b in zip(model(x), ref(x)):
            assert a.shape == b.shape and a.is_contiguous()
            assert rel_err(a, b) < FP32_PARITY


@pytest.mark.parametrize('v2', [False, True])
def test_fused_inference_equals_official_formulation_and_plain_ops(v2):
    """CPU fp32 inference (oneDNN epilogues; V1's attention residual added inside ``proj`` after the windows are
    merged back, PatchMerging's reduction on oneDNN) at a padded, shifted size: within fp32 rounding of the official
    formulation and of the plain ops (fusion disabled)."""
    from mmplugin.models.layers.fusion import onednn_fusion_disabled
    model, ref = _pair(v2, seed=2)
    x = torch.randn(1, 3, 92, 124)
    with torch.inference_mode():
        with onednn_fusion_disabled():
            plain = model(x)
        got, want = model(x), ref(x)
    for a, b, c in zip(got, want, plain):
        assert rel_err(a, b) < FP32_PARITY and rel_err(a, c) < FP32_PARITY


def test_v2_pretrained_window_size_changes_the_bias():
    model, ref = _pair(True, ws=12, pws=8)
    x = torch.randn(1, 3, 200, 170)
    with torch.no_grad():
        got = model(x)
        for a, b in zip(got, ref(x)):
            assert rel_err(a, b) < FP32_PARITY
        same = SwinTransformerV2(SMALL_ARCH, window_size=12, pretrained_window_size=12, drop_path_rate=0.).eval()
        same.load_state_dict(model.state_dict())
        assert rel_err(same(x)[0], got[0]) > 10 * FP32_PARITY  # beyond rounding


@pytest.mark.parametrize('v2,ws,hw,windows,shifts', [
    # Swin-T at its 224 pretraining size: the 7x7 last map equals the window, so its shift is dropped
    (False, 7, (224, 224), [7, 7, 7, 7], (True, True, True, False)),
    # Swin V2 w16 at 256: stage 3 (16x16) loses its shift, stage 4 (8x8) is one 8x8 window without shift
    (True, 16, (256, 256), [16, 16, 16, 8], (True, True, False, False)),
    # a map smaller than the window on one side only: min(H, W) decides, the rest is padded
    (True, 8, (200, 120), [8, 8, 8, 4], (True, True, False, False)),  # maps 50x30, 25x15, 13x8, 7x4
    (False, 7, (200, 120), [7, 7, 7, 4], (True, True, True, False)),
])
def test_pad_small_map_false_is_the_classification_formulation(v2, ws, hw, windows, shifts):
    """pad_small_map=False equals the official classification code built for this input size (window shrunk to
    a small map, shift dropped); the default (padding, detection code) differs on the same input."""
    cls = SwinTransformerV2 if v2 else SwinTransformer
    model = randomize_(cls(SMALL_ARCH, window_size=ws, drop_path_rate=0.0, pad_small_map=False), seed=3).eval()
    ref = ReferenceSwin(SMALL_ARCH['embed_dims'], SMALL_ARCH['depths'], SMALL_ARCH['num_heads'], windows, v2, 0,
                        shifts).eval()
    sd = model.state_dict()
    if not v2:  # the official code builds a table for the small window: the same offsets, i.e. the centre
        for i, w in enumerate(windows):
            for j in range(SMALL_ARCH['depths'][i]):
                k = f'layers.{i}.blocks.{j}.attn.relative_position_bias_table'
                full = sd[k].view(2 * ws - 1, 2 * ws - 1, -1)
                lo = ws - w
                sd[k] = full[lo:lo + 2 * w - 1, lo:lo + 2 * w - 1].reshape(-1, full.shape[-1])
    ref.load_state_dict(sd)
    x = torch.randn(1, 3, *hw)
    padded = cls(SMALL_ARCH, window_size=ws, drop_path_rate=0.0).eval()
    padded.load_state_dict(model.state_dict())
    with torch.no_grad():
        got, want, other = model(x), ref(x), padded(x)
    for a, b in zip(got, want):
        assert rel_err(a, b) < FP32_PARITY
    assert rel_err(other[3], want[3]) > 10 * FP32_PARITY, 'the default must differ, or the test proves nothing'


@pytest.mark.parametrize('h, w, ws, shift', [(14, 21, 7, 3), (13, 19, 7, 3), (13, 19, 7, 0), (16, 16, 8, 4)])
def test_window_gathers_have_exact_gradients(h, w, ws, shift):
    """The window partition and its reverse carry each other as their backward (they are each other's transpose:
    pad + permutation against inverse permutation + crop): ``gradcheck`` in float64 against finite differences,
    divisible and padded maps, shifted and not; and the backward does not fall back to autograd's scatter."""
    from mmplugin.models.backbones.swin.windows import WindowGeometry
    geom = WindowGeometry(h, w, ws, shift, torch.device('cpu'), torch.float64)
    x = torch.randn(2, h, w, 3, dtype=torch.float64, requires_grad=True)
    win = torch.randn(2 * geom.num_windows, ws * ws, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(geom.partition, (x, ))
    assert torch.autograd.gradcheck(lambda t: geom.reverse(t, 2), (win, ))
    assert type(geom.partition(x).grad_fn).__name__ == '_PartitionBackward'
    assert type(geom.reverse(win, 2).grad_fn).__name__ == '_ReverseBackward'


@pytest.mark.parametrize('h, w, ws, shift, c', [(9, 10, 7, 3, 32), (8, 9, 7, 0, 48), (3, 5, 4, 2, 32)])
def test_projection_before_the_partition_is_the_projection_of_the_windows(h, w, ws, shift, c):
    """Where padding is a large share, q, k, v are projected on the real tokens (plus one zero token that fills the
    padding positions) before the partition: the windows must equal ``project(partition(x))``, and the gradients
    of the input and of the projection's weight and bias must equal those through the partition, in float64
    (gradcheck for the gather and its adjoint); the bias gradient includes the padding positions' share."""
    from mmplugin.models.backbones.swin.windows import PROJECT_FIRST_MIN, WindowGeometry, _PartitionTokens
    geom = WindowGeometry(h, w, ws, shift, torch.device('cpu'), torch.float64)
    assert (geom.hp * geom.wp - h * w) * c >= PROJECT_FIRST_MIN * h * w, 'must take the projection-first path'
    proj = torch.nn.Linear(c, 3 * c).double()
    x = torch.randn(2, h, w, c, dtype=torch.float64, requires_grad=True)
    got = geom.partition_projected(x, proj)
    assert type(got.grad_fn).__name__ == '_PartitionTokensBackward'
    want = proj(geom.partition(x))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    grads = [torch.autograd.grad(out, (x, proj.weight, proj.bias), g) for out in (got, want)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    tokens = torch.randn(2, h * w, 3, dtype=torch.float64, requires_grad=True)
    pad = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, p: _PartitionTokens.apply(t, p, geom), (tokens, pad))


@pytest.mark.parametrize('v2', [False, True])
def test_projection_first_is_the_same_swin_with_gradients(v2):
    """The whole backbone with a stage whose padding takes the projection-first path (16 x 24 at stage 4 of a 512 x
    768 input, as 7x7 windows pad it 53%) gives the outputs and parameter gradients of the official formulation."""
    model, ref = _pair(v2)
    x = torch.randn(1, 3, 130, 200)
    outs = [m(x) for m in (model, ref)]
    for a, b in zip(*outs):
        assert rel_err(a, b) < FP32_PARITY
    for m, out in zip((model, ref), outs):
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in out).backward()
    ref_grads = dict(ref.named_parameters())
    compared = 0
    for name, p in model.named_parameters():
        if name in ref_grads and ref_grads[name].grad is not None:
            assert rel_err(p.grad, ref_grads[name].grad) < 10 * FP32_PARITY, name
            compared += 1
    assert compared > 10


@pytest.mark.parametrize('v2', [False, True])
def test_bias_only_fine_tuning_gets_the_padding_share_of_the_bias_gradient(v2):
    """qkv weight frozen, its bias trained (bias-only fine-tuning): the zero token that fills the padding positions
    (projection first) must reach the bias gradient as in the float64 reference (fp32 within rounding)."""
    from mmplugin.models.backbones.swin.attention import WindowAttention, WindowAttentionV2
    from mmplugin.models.backbones.swin.windows import WindowGeometry
    torch.manual_seed(0)
    attn = (WindowAttentionV2 if v2 else WindowAttention)(64, 2, 7).train()
    randomize_(attn, 0)
    attn.qkv.weight.requires_grad_(False)
    biases = ['q_bias', 'v_bias'] if v2 else ['qkv.bias']
    x = torch.randn(2, 9, 10, 64)
    g = torch.randn(2, 9, 10, 64)
    grads = []
    for dtype in (torch.float32, torch.float64):
        m = copy.deepcopy(attn).to(dtype)
        m(x.to(dtype), WindowGeometry(9, 10, 7, 3, torch.device('cpu'), dtype)).backward(g.to(dtype))
        params = dict(m.named_parameters())
        grads.append([params[n].grad for n in biases])
    for name, a, b in zip(biases, *grads):
        assert a is not None and rel_err(a, b) < FP32_PARITY, name


def test_sizes_change_between_calls_no_stale_mask():
    model, ref = _pair(False)
    with torch.no_grad():
        for hw in [(250, 330), (64, 64), (90, 77), (250, 330), (17, 200)]:
            x = torch.randn(1, 3, *hw)
            for a, b in zip(model(x), ref(x)):
                assert rel_err(a, b) < FP32_PARITY, hw


def _to_mmdet(sd):
    """Plugin/official layout -> mmdet 3.x SwinTransformer layout, from mmdet's documented converter rules."""
    out = {}
    for k, v in sd.items():
        if 'downsample.reduction' in k:
            o, n = v.shape
            v = v.reshape(o, 4, n // 4)[:, [0, 2, 1, 3], :].transpose(1, 2).reshape(o, n)
        elif 'downsample.norm' in k:
            v = v.reshape(4, -1)[[0, 2, 1, 3], :].transpose(0, 1).reshape(-1)
        k = re.sub(r'^layers\.', 'stages.', k)
        k = k.replace('.attn.', '.attn.w_msa.').replace('.mlp.fc1.', '.ffn.layers.0.0.')
        k = k.replace('.mlp.fc2.', '.ffn.layers.1.').replace('patch_embed.proj.', 'patch_embed.projection.')
        out[k] = v
    return out


@pytest.mark.parametrize('ws,hw', [(7, (250, 330)), (7, (20, 28)), (12, (410, 300))])
def test_v1_equals_mmdet_swin(ws, hw):
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    ours = randomize_(SwinTransformer('tiny', window_size=ws, drop_path_rate=0.0), seed=1, scale=0.1).eval()
    theirs = MMDetSwin(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=ws,
                       drop_path_rate=0.0)
    theirs.eval()  # mmdet's train() does not return self
    sd = _to_mmdet(ours.state_dict())
    missing, unexpected = theirs.load_state_dict(sd, strict=False)
    assert not unexpected and all('relative_position_index' in k for k in missing)
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        for a, b in zip(ours(x), theirs(x)):
            assert a.shape == b.shape
            assert rel_err(a, b) < FP32_PARITY


# ------------------------------------------------------------------------------------------------ weights
def _load(cls, obj, tmp_path, **kw):
    path = tmp_path / 'ckpt.pth'
    torch.save(obj, path)
    model = cls(init_cfg=dict(type='Pretrained', checkpoint=str(path)), drop_path_rate=0.0, **kw)
    model.init_weights()
    return model


def _assert_arrived(model, plugin_sd, skip=(), copy_classifier_norm=False):
    """Every checkpoint tensor arrived at its place. The classifier's ``norm.*`` is ignored by default (``norm3``
    stays fresh: weight 1, bias 0, as mmdet loads it) and lands in ``norm3`` with ``copy_classifier_norm``."""
    msd = model.state_dict()
    for k, v in plugin_sd.items():
        if k.endswith(('relative_position_index', 'attn_mask', 'relative_coords_table')) or k.startswith('head.'):
            continue
        if k.startswith('norm.') and not copy_classifier_norm:
            fresh = torch.ones_like(v) if k.endswith('weight') else torch.zeros_like(v)
            assert torch.equal(msd['norm3.' + k[5:]], fresh), k
            continue
        k2 = 'norm3.' + k[5:] if k.startswith('norm.') else k
        if k2 in skip:
            continue
        assert torch.equal(msd[k2], v), k


@pytest.mark.parametrize('copy_norm', [False, True])
@pytest.mark.parametrize('v2', [False, True])
def test_official_key_list_loads_every_parameter(tmp_path, v2, copy_norm):
    section = 'V2 tiny' if v2 else 'V1 tiny'
    shapes = official_keys(KEYS, section)
    assert len(shapes) == (250 if v2 else 190)
    sd = random_state_dict(shapes)
    cls = SwinTransformerV2 if v2 else SwinTransformer
    model = _load(cls, {'model': sd}, tmp_path, arch='tiny', window_size=8 if v2 else 7,
                  copy_classifier_norm=copy_norm)
    _assert_arrived(model, sd, copy_classifier_norm=copy_norm)
    body = [k for k in model.state_dict() if not re.match(r'norm[0-2]\.', k)]
    official = {('norm3.' + k[5:] if k.startswith('norm.') else k) for k in sd}
    assert set(body) <= official


def test_official_v1_window7_into_window12_resizes_bias_table(tmp_path):
    sd = random_state_dict(official_keys(KEYS, 'V1 tiny'))
    key = 'layers.2.blocks.1.attn.relative_position_bias_table'
    sd[key][:, 0] = 0.5  # a constant head must stay constant
    model = _load(SwinTransformer, {'model': sd}, tmp_path, arch='tiny', window_size=12)
    got = model.state_dict()[key]
    assert got.shape == (23 * 23, 12)
    # bicubic weights sum to 1 over 4x4 taps: a constant stays constant to 16 fp32 roundings of 0.5 (4.8e-7)
    assert torch.allclose(got[:, 0], torch.full((529, ), 0.5), atol=1e-6)
    src = sd[key].t().reshape(1, 12, 13, 13)
    want = F.interpolate(src, size=(23, 23), mode='bicubic', align_corners=False).reshape(12, -1).t()
    assert torch.allclose(got, want)
    # the centre of a 13x13 table lands at the centre of the 23x23 one (zero offset stays zero offset)
    # not an equality: bicubic resampling moves the centre value by its neighbours' curvature (randn * 0.3 weights,
    # so up to about one standard deviation, 0.3); a misplaced centre lands on another offset's independent entry
    # (difference std 0.42 per head: all twelve heads within 0.35 by chance, about 0.2%)
    assert torch.allclose(got.view(23, 23, 12)[11, 11], src[0, :, 6, 6], atol=0.35)


def test_v2_window8_into_window16_regenerates_coords(tmp_path):
    sd = random_state_dict(official_keys(KEYS, 'V2 tiny'))
    model = _load(SwinTransformerV2, {'model': sd}, tmp_path, arch='tiny', window_size=16,
                  pretrained_window_size=[8, 8, 8, 8])
    attn = model.layers[0].blocks[0].attn
    assert attn.relative_coords_table.shape == (31, 31, 2)
    # official V2 formulation, written out per offset: t = d / (pretrained_ws - 1) * 8, sign(t) log2(1 + |t|) / 3
    table = attn.relative_coords_table
    for d in (-15, -8, -1, 0, 1, 7, 15):  # |values| <= 1.4, a few fp32 operations: error ~1e-7, bound 1e-6
        t = d / 7 * 8
        want = math.copysign(math.log2(1 + abs(t)) / 3, t) if d else 0.0
        assert table[d + 15, 0, 0].item() == pytest.approx(want, abs=1e-6)  # row offset
        assert table[0, d + 15, 1].item() == pytest.approx(want, abs=1e-6)  # column offset
        assert table[d + 15, 3, 0].item() == pytest.approx(want, abs=1e-6)  # independent of the other axis
    _assert_arrived(model, sd)


@pytest.mark.parametrize('copy_norm', [False, True])
@pytest.mark.parametrize('v2', [False, True])
def test_timm_layout(tmp_path, v2, copy_norm):
    src = randomize_((SwinTransformerV2 if v2 else SwinTransformer)(SMALL_ARCH, window_size=7), seed=2)
    sd = src.state_dict()
    timm = {}
    for k, v in sd.items():
        m = re.match(r'layers\.(\d)\.downsample\.(.*)', k)
        if m:
            k = f'layers.{int(m.group(1)) + 1}.downsample.{m.group(2)}'
        timm[k.replace('norm3.', 'norm.')] = v
    timm = {k: v for k, v in timm.items() if not re.match(r'norm[0-2]\.', k)}
    timm['head.fc.weight'] = torch.zeros(10, 256)
    model = _load(type(src), timm, tmp_path, arch=SMALL_ARCH, window_size=7, copy_classifier_norm=copy_norm)
    _assert_arrived(model, {k.replace('norm3.', 'norm.'): v for k, v in sd.items() if not re.match(r'norm[0-2]\.', k)},
                    copy_classifier_norm=copy_norm)


@pytest.mark.parametrize('prefix', ['backbone.', ''])  # mmdet detector checkpoint / mmseg converted backbone
def test_mmdet_mmseg_layout(tmp_path, prefix):
    src = randomize_(SwinTransformer(SMALL_ARCH, window_size=7), seed=3)
    mm = {prefix + k: v for k, v in _to_mmdet(src.state_dict()).items()}
    if prefix:
        mm['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    model = _load(SwinTransformer, {'state_dict': mm, 'meta': {}}, tmp_path, arch=SMALL_ARCH, window_size=7)
    _assert_arrived(model, src.state_dict())


def test_plugin_to_mmdet_matches_documented_rules():
    from mmplugin.models.backbones.swin.converter import plugin_to_mmdet_swin
    sd = randomize_(SwinTransformer(SMALL_ARCH, window_size=7), seed=9).state_dict()
    ours, ref = plugin_to_mmdet_swin(sd), _to_mmdet(sd)
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)


def test_mmpretrain_v2_layout(tmp_path):
    src = randomize_(SwinTransformerV2(SMALL_ARCH, window_size=8), seed=4)
    out = {}
    for k, v in src.state_dict().items():
        m = re.match(r'layers\.(\d)\.downsample\.(.*)', k)
        if m:  # mmpretrain V2: merge at the start of the next stage, Unfold order for the reduction only
            if m.group(2) == 'reduction.weight':
                o, n = v.shape
                v = v.reshape(o, 4, n // 4)[:, [0, 2, 1, 3], :].transpose(1, 2).reshape(o, n)
            k = f'stages.{int(m.group(1)) + 1}.downsample.{m.group(2)}'
        k = re.sub(r'^layers\.', 'stages.', k).replace('.attn.', '.attn.w_msa.')
        k = k.replace('.mlp.fc1.', '.ffn.layers.0.0.').replace('.mlp.fc2.', '.ffn.layers.1.')
        out[k.replace('patch_embed.proj.', 'patch_embed.projection.')] = v
    model = _load(SwinTransformerV2, {'state_dict': out}, tmp_path, arch=SMALL_ARCH, window_size=8)
    _assert_arrived(model, src.state_dict())


def test_version_mismatch_and_bad_shapes(tmp_path):
    v1 = random_state_dict(official_keys(KEYS, 'V1 tiny'))
    with pytest.raises(CheckpointError, match='Swin V1 checkpoint but the model is Swin V2'):
        _load(SwinTransformerV2, {'model': v1}, tmp_path, arch='tiny')
    v2 = random_state_dict(official_keys(KEYS, 'V2 tiny'))
    with pytest.raises(CheckpointError, match='Swin V2 checkpoint but the model is Swin V1'):
        _load(SwinTransformer, {'model': v2}, tmp_path, arch='tiny')
    with pytest.raises(CheckpointError, match=r"shape mismatch for '.*': checkpoint \(.*\) vs model"):
        _load(SwinTransformer, {'model': v1}, tmp_path, arch='base')
    bad = dict(v1)
    bad['layers.0.blocks.0.attn.relative_position_bias_table'] = torch.zeros(170, 3)
    with pytest.raises(CheckpointError, match='relative_position_bias_table.*cannot be resized'):
        _load(SwinTransformer, {'model': bad}, tmp_path, arch='tiny')


# ------------------------------------------------------------------------------------------------ options
def test_v2_bf16_logit_scale_is_clamped():
    model = SwinTransformerV2(SMALL_ARCH).train()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, 'logit_scale'):
                m.logit_scale.fill_(math.log(1000.0))  # must be clamped at log(100)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(2, 3, 75, 83))
        loss = sum(o.float().pow(2).mean() for o in outs)
    loss.backward()
    assert all(torch.isfinite(o.float()).all() for o in outs)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    scales = [m.logit_scale for m in model.modules() if hasattr(m, 'logit_scale')]
    assert scales and all(s.grad is not None and torch.all(s.grad == 0) for s in scales), \
        'a clamped logit scale receives no gradient'


def test_arch_aliases_and_outputs():
    for a, b in [('t', 'tiny'), ('s', 'small'), ('b', 'base'), ('l', 'large')]:
        assert SwinTransformer.resolve_arch(a) == SwinTransformer.resolve_arch(b)
    m = SwinTransformer('tiny', out_indices=(1, 3))
    assert m.out_channels == [192, 768] and m.out_strides == [8, 32]
    assert len(m(torch.rand(1, 3, 64, 64))) == 2


@pytest.mark.parametrize('cls,kwargs,match', [
    (SwinTransformer, dict(arch='huge'), "unknown arch 'huge'"),
    (SwinTransformer, dict(arch=dict(embed_dims=96, depths=[2, 2, 6, 2])), r"missing \['num_heads'\]"),
    (SwinTransformer, dict(arch=dict(embed_dims=[96] * 4, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])),
     'embed_dims is the stage-1 width'),
    (SwinTransformer, dict(window_size=7.5), 'window_size must be an int or a list of 4 ints'),
    (SwinTransformer, dict(window_size=[7, 7, 7.5, 7]), 'window_size must hold ints'),
    (SwinTransformer, dict(drop_path_rate=1.0), r'drop_path_rate must be a number in \[0, 1\)'),
    (SwinTransformer, dict(drop_path_rate=-0.1), 'drop_path_rate'),
    # len(depths) is the number of stages (mmdet / mmseg meaning): the per-stage lists must follow it
    (SwinTransformer, dict(arch=dict(embed_dims=96, depths=[2, 2, 6], num_heads=[3, 6, 12, 24]), out_indices=(0, 1, 2)),
     'num_heads must be an int or a list of 3'),
    (SwinTransformer, dict(arch=dict(embed_dims=96, depths=[2, 2, 6], num_heads=[3, 6, 12])),
     r'out_indices must be distinct stage indices in 0\.\.2, got \(0, 1, 2, 3\)'),
    (SwinTransformer, dict(arch=dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[5, 6, 12, 24])), 'divisible'),
    (SwinTransformer, dict(window_size=0), 'window_size must be >= 1'),
    (SwinTransformer, dict(pretrained_window_size=8), 'V2 option'),
    (SwinTransformerV2, dict(pretrained_window_size=[8, 8]), 'pretrained_window_size'),
])
def test_bad_construction(cls, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        cls(**kwargs)


@pytest.mark.parametrize('h, w, ws, shift', [(200, 304, 7, 3), (13, 19, 7, 3), (16, 16, 8, 4), (7, 7, 7, 3)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])
def test_shift_mask_equals_the_official_construction(h, w, ws, shift, dtype):
    """The eager mask (zeros, only the windows with several shift regions computed) and the traced form (every
    window) equal the official construction: regions sliced on the padded map, windows partitioned, -100 across
    regions, 0 within. The window-attention kernels' fp32 copy of a geometry's mask is the fp32 mask bit for bit,
    made once per geometry."""
    from mmplugin.models.backbones.swin.windows import (
        MASK_VALUE,
        WindowGeometry,
        _window_index,
        padded_size,
        shift_mask,
    )
    hp, wp = padded_size(h, ws), padded_size(w, ws)
    img = torch.zeros(hp, wp)
    region = 0
    for rs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for cs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[rs, cs] = region
            region += 1
    windows = img.view(hp // ws, ws, wp // ws, ws).permute(0, 2, 1, 3).reshape(-1, ws * ws)
    official = (windows[:, None, :] - windows[:, :, None]).ne(0).float() * MASK_VALUE
    label = _window_index(h, w, ws, shift, torch.device('cpu'))[2]
    eager, traced = shift_mask(label, dtype, False), shift_mask(label, dtype, True)
    assert eager.dtype == traced.dtype == dtype and eager.shape == official.shape
    assert torch.equal(eager.float(), official) and torch.equal(traced.float(), official)
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
    assert torch.equal(eager.view(bits), traced.view(bits))  # bit for bit, the sign of zero included
    geom = WindowGeometry(h, w, ws, shift, torch.device('cpu'), dtype)
    assert torch.equal(geom.mask, eager)
    kernel = geom.kernel_mask()
    assert kernel.dtype == torch.float32 and kernel is geom.kernel_mask()  # shared by the stage's blocks
    assert torch.equal(kernel.view(torch.int32), shift_mask(label, torch.float32, False).view(torch.int32))
