"""mmdet / mmseg / mmpretrain Swin keywords on the plugin's Swin backbones, and ``pretrained=`` on every backbone:
honoured with their home library's meaning (checked against mmdet's own SwinTransformer) or refused in one error
that lists every such key."""
from __future__ import annotations

import warnings

import pytest
import torch
from conftest import FP64_PARITY, outputs_in_float64, randomize_, rel_err

from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2
from mmplugin.models.backbones.arguments import UnsupportedArgumentsError
from mmplugin.models.backbones.swin.converter import plugin_to_mmdet_swin

pytestmark = pytest.mark.numeric  # rerun on older CPU kernel families by tools/run_tests.sh

SMALL = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])


def _mmdet_pair(**kwargs):
    """mmdet's SwinTransformer and the plugin's, built from the same mmdet keywords, with the same weights."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    theirs = MMDetSwin(**kwargs)
    theirs.eval()  # mmdet's SwinTransformer.train() returns None
    ours = randomize_(SwinTransformer(**kwargs), seed=2).eval()
    theirs.load_state_dict(plugin_to_mmdet_swin(ours.state_dict()), strict=False)
    return ours, theirs


def test_mmdet_arch_keywords_build_the_same_model():
    model = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
    assert (model.embed_dims, model.depths, model.num_heads) == (96, [2, 2, 6, 2], [3, 6, 12, 24])
    # missing keys take mmdet's defaults (Swin-T's)
    assert SwinTransformer(embed_dims=48, num_heads=[3, 6, 12, 24]).depths == [2, 2, 6, 2]
    # the same values with an explicit arch are fine; different ones are an error
    SwinTransformer('tiny', embed_dims=96)
    with pytest.raises(ValueError, match=r"embed_dims=128 disagree with arch='tiny'"):
        SwinTransformer('tiny', embed_dims=128)


@pytest.mark.parametrize('kwargs', [
    dict(qk_scale=0.07),
    dict(strides=(4, 2, 2, 2), patch_size=4, convert_weights=True, pretrain_img_size=384, use_abs_pos_embed=False,
         act_cfg=dict(type='GELU'), norm_cfg=dict(type='LN'), patch_norm=True, with_cp=False, drop_rate=0.1,
         attn_drop_rate=0.1, window_size=5),
])
def test_mmdet_keywords_equal_mmdet(kwargs):
    ours, theirs = _mmdet_pair(**SMALL, drop_path_rate=0.0, **kwargs)
    x = torch.randn(1, 3, 71, 90)
    # float64: the same function to rounding, on any CPU's kernels (conftest: FP64_PARITY)
    for a, b in zip(outputs_in_float64(ours, x), outputs_in_float64(theirs, x)):
        assert rel_err(a, b) < FP64_PARITY


def test_training_gradients_equal_mmdet(monkeypatch):
    """A training forward + backward at a padded, shifted size (windows 7 on 71x90): the plugin's explicit CPU
    attention path (taken because the position bias is learnt) gives every parameter the gradient mmdet's Swin
    gives it with the same weights. In float64, so the bound is the same function's rounding on any CPU's kernels
    (fp32 errors grow along the backward chain beyond a single computation's)."""
    from mmplugin.models.backbones.swin import attention
    calls = []
    explicit = attention._attend_explicit
    monkeypatch.setattr(attention, '_attend_explicit', lambda *a: calls.append(1) or explicit(*a))
    ours, theirs = _mmdet_pair(**SMALL, drop_path_rate=0.0)
    ours.double().train()
    theirs.double().train()
    x = torch.randn(2, 3, 71, 90, dtype=torch.float64)
    weights = [torch.randn(o.shape, dtype=torch.float64) for o in ours(x)]
    for model in (ours, theirs):
        sum((o * w).sum() for o, w in zip(model(x), weights)).backward()
    assert len(calls) == 2 * sum(SMALL['depths'])  # the plugin's two forwards, every block explicit
    # the layout conversion only renames and permutes, so it maps gradients as it maps weights
    mine = plugin_to_mmdet_swin({n: p.grad for n, p in ours.named_parameters() if p.grad is not None})
    want = {n: p.grad for n, p in theirs.named_parameters() if p.grad is not None}
    assert mine.keys() == want.keys()
    for name, g in want.items():
        assert rel_err(mine[name], g) < FP64_PARITY, name


def test_dropout_rates_act_in_training_only():
    base = randomize_(SwinTransformer(SMALL, drop_path_rate=0.0), seed=4)
    drop = SwinTransformer(SMALL, drop_path_rate=0.0, drop_rate=0.3, attn_drop_rate=0.3)
    drop.load_state_dict(base.state_dict())
    x = torch.randn(1, 3, 64, 64)
    base.eval(), drop.eval()
    with torch.no_grad():
        assert torch.equal(base(x)[3], drop(x)[3])
        base.train(), drop.train()
        assert torch.equal(base(x)[3], base(x)[3])
        assert rel_err(drop(x)[3], base(x)[3]) > 1e-2
    for m in (drop.drop_after_pos, drop.layers[0].blocks[0].mlp.drop, drop.layers[0].blocks[0].attn.proj_drop):
        assert m.p == 0.3
    assert drop.layers[2].blocks[1].attn.attn_drop == 0.3


def test_norm_cfg_requires_grad_false_fixes_every_layernorm():
    model = SwinTransformer(SMALL, norm_cfg=dict(type='LN', requires_grad=False))
    lns = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert lns and all(not p.requires_grad for m in lns for p in m.parameters())
    assert model.layers[0].blocks[0].attn.qkv.weight.requires_grad


def test_one_error_lists_every_key_and_names_the_public_class():
    with pytest.raises(UnsupportedArgumentsError) as info:
        SwinTransformer(strides=(4, 2, 1, 2), use_abs_pos_embed=True, out_after_downsample=True,
                        act_cfg=dict(type='ReLU'), norm_cfg=dict(type='BN'), stage_cfgs=dict(block_cfgs=dict()),
                        patch_cfg=dict(padding='same'), bogus=1)
    msg = str(info.value)
    assert msg.startswith('mmplugin.SwinTransformer cannot honour 8 argument(s)')
    for key in ('strides=(4, 2, 1, 2)', 'use_abs_pos_embed=True', 'out_after_downsample=True', "act_cfg={'type': "
                "'ReLU'}", "norm_cfg={'type': 'BN'}", 'stage_cfgs=', 'patch_cfg=', 'bogus: unknown argument'):
        assert key in msg, key
    assert '_SwinBase' not in msg and 'mmdet/mmseg meaning' in msg and 'mmpretrain meaning' in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_mmpretrain_keywords():
    v2 = SwinTransformerV2(SMALL, window_size=8, pretrained_window_sizes=[6, 6, 6, 4], img_size=256,
                           stage_cfgs=dict(downsample_cfg=dict(is_post_norm=True)), patch_cfg=dict(),
                           out_after_downsample=False, interpolate_mode='bicubic', pad_small_map=True)
    assert [b.attn.pretrained_window_size for b in (v2.layers[0].blocks[0], v2.layers[3].blocks[0])] == [6, 4]
    with pytest.raises(UnsupportedArgumentsError, match='pretrained_window_sizes is a Swin V2 argument'):
        SwinTransformer(SMALL, pretrained_window_sizes=[7] * 4)
    with pytest.raises(UnsupportedArgumentsError, match='qk_scale'):
        SwinTransformerV2(SMALL, qk_scale=0.1)
    with pytest.raises(UnsupportedArgumentsError, match='stage_cfgs'):
        SwinTransformer(SMALL, stage_cfgs=dict(downsample_cfg=dict(is_post_norm=True)))


@pytest.mark.parametrize('cls,arch', [(SwiftFormer, 'xs'), (SwinTransformer, SMALL)])
def test_pretrained_argument(cls, arch, tmp_path):
    with pytest.warns(UserWarning, match=r"ignoring pretrained='open-mmlab://resnet50_v1c'.*model.pretrained=None"):
        model = cls(arch, pretrained='open-mmlab://resnet50_v1c')
    assert model.init_cfg is None
    path = tmp_path / 'w.pth'
    torch.save(model.state_dict(), path)
    with pytest.warns(UserWarning, match='pretrained is deprecated'):
        other = cls(arch, pretrained=str(path))
    assert other.init_cfg == dict(type='Pretrained', checkpoint=str(path))
    other.init_weights()
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match='init_cfg and pretrained cannot be set at the same time'):
        cls(arch, pretrained=str(path), init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(TypeError, match='pretrained must be a str'):
        cls(arch, pretrained=123)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        cls(arch, pretrained=None)
