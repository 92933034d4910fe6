"""The checks of the upstream Swin backbone unit tests, ported to ``mmplugin.SwinTransformer`` /
``mmplugin.SwinTransformerV2`` built through each library's registry with the upstream arguments.

Sources (read, not copied; the logic is rewritten here):

* mmdet 3.x ``tests/test_models/test_backbones/test_swin.py`` (built through ``mmdet.registry.MODELS``);
* mmseg 1.x ``tests/test_models/test_backbones/test_swin.py`` (``mmseg.registry.MODELS``);
* mmpretrain 1.x ``tests/test_models/test_backbones/test_swin_transformer.py`` and
  ``test_swin_transformer_v2.py`` (mmengine's root ``MODELS`` with ``type='mmplugin.SwinTransformer[V2]'``:
  mmpretrain need not be installed).

Where upstream and the plugin differ on purpose the port checks the plugin's documented behaviour and says why:

* ``frozen_stages``: the plugin follows mmdet (``0`` = patch embedding only); mmpretrain's ``0`` also freezes stage 1,
  so mmpretrain's ``frozen_stages=0`` is ported as ``1``.
* default ``out_indices``: mmpretrain returns only the last stage by default, the plugin all four (dense prediction).
* ``pad_small_map=False`` with a map smaller than the window: mmpretrain raises; the plugin follows the official
  classification code (window shrinks to the map, no shift), so it computes a result.
* refused (one clear error naming the key and the public class): non-LayerNorm ``norm_cfg`` / ``stage_cfgs`` block
  norms (upstream's ``norm_eval`` check builds BatchNorm Swin), mmpretrain V2's ``extra_norm_every_n_blocks != 0``
  (the unreleased huge / giant archs), ``strides`` other than ``(patch_size, 2, 2, 2)``, a 3-element
  ``pretrain_img_size``, non-str ``pretrained``.
* ``use_abs_pos_embed=True``: honouring and refusing are both acceptable; the port accepts either, and checks the
  upstream behaviour when honoured and the error when refused.

Not ported: mmdet's ``SwinBlock`` unit test (an internal class with another signature) and mmpretrain's loading of its
own legacy checkpoint versions (``_version`` 1/2 key renames of mmpretrain models, not of plugin checkpoints; the
plugin's checkpoint conversion is tested in tests/models/backbones/test_swin.py).
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import FP32_PARITY, randomize_, rel_err
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.runner import load_checkpoint, save_checkpoint

from mmplugin.models.layers import DropPath


def _registry(name):
    if name == 'mmdet':
        from mmdet.registry import MODELS
    elif name == 'mmseg':
        from mmseg.registry import MODELS
    else:
        MODELS = ROOT_MODELS
    return MODELS


def build(lib: str, v2: bool = False, **kwargs):
    cls = 'SwinTransformerV2' if v2 else 'SwinTransformer'
    return _registry(lib).build(dict(type=f'mmplugin.{cls}', **kwargs))


def assert_refused(lib: str, keys, v2: bool = False, **kwargs):
    """The plugin refuses the call with one clear error that names every key and the public class."""
    with pytest.raises((TypeError, ValueError)) as info:
        build(lib, v2=v2, **kwargs)
    msg = str(info.value)
    for key in keys:
        assert key in msg, (key, msg)
    assert f'mmplugin.SwinTransformer{"V2" if v2 else ""}' in msg, msg
    assert '_SwinBase' not in msg, msg
    return msg


def build_or_refused(lib: str, keys, v2: bool = False, **kwargs):
    """For a value the plugin may either honour or refuse: the built model (the caller then checks the
    upstream behaviour), or None after checking that the refusal is the clear one."""
    try:
        return build(lib, v2=v2, **kwargs)
    except (TypeError, ValueError):
        assert_refused(lib, keys, v2=v2, **kwargs)
        return None


def params_with_prefix(model, prefix):
    out = [p for n, p in model.named_parameters() if n.startswith(prefix)]
    assert out, prefix
    return out


def block_drop_path_rates(model):
    return [m.p for m in model.modules() if isinstance(m, DropPath)]


@torch.no_grad()
def shapes(model, *size):
    return [tuple(o.shape) for o in model.eval()(torch.randn(1, 3, *size))]


# ================================================================================================ mmdet / mmseg
@pytest.mark.parametrize('lib', ['mmdet', 'mmseg'])
class TestMMDetMMSegSwin:
    """mmdet's and mmseg's test_swin_transformer (the two files test the same things)."""

    def test_pretrained_must_be_a_string_or_none(self, lib):
        with pytest.raises(TypeError) as info:
            build(lib, pretrained=123)
        assert 'pretrained' in str(info.value) and '_SwinBase' not in str(info.value)

    def test_patch_embed_stride_must_equal_patch_size(self, lib):
        assert_refused(lib, ['strides'], strides=(2, 2, 2, 2), patch_size=4)
        # the default strides of mmdet / mmseg describe the plugin's only geometry and are accepted
        model = build(lib, strides=(4, 2, 2, 2), patch_size=4)
        assert shapes(model, 64, 64) == [(1, 96, 16, 16), (1, 192, 8, 8), (1, 384, 4, 4), (1, 768, 2, 2)]

    def test_pretrain_img_size(self, lib):
        assert_refused(lib, ['pretrain_img_size'], pretrain_img_size=(224, 224, 224))
        build(lib, pretrain_img_size=(224, ))  # mmseg: a 1-tuple is accepted
        build(lib, pretrain_img_size=224)

    def test_absolute_position_embedding(self, lib):
        model = build_or_refused(lib, ['use_abs_pos_embed'], pretrain_img_size=224, use_abs_pos_embed=True)
        if model is None:
            return
        model.init_weights()
        assert dict(model.named_parameters())['absolute_pos_embed'].shape[-1] == 96
        assert shapes(model, 224, 224)[-1] == (1, 768, 7, 7)

    def test_patch_norm_false(self, lib):
        model = build_or_refused(lib, ['patch_norm'], patch_norm=False)
        if model is None:
            return
        # mmdet / mmseg: patch_norm=False removes the norm of the patch embedding AND of every patch merging
        names = [n for n, _ in model.named_parameters()]
        assert not [n for n in names if n.startswith('patch_embed.norm') or '.downsample.norm' in n]
        assert shapes(model, 224, 224)[-1] == (1, 768, 7, 7)

    def test_frozen_stages_4_freezes_everything(self, lib):
        model = build(lib, frozen_stages=4)
        model.train()
        assert all(not p.requires_grad for p in model.parameters())


# the 512 px forwards run through one registry (the class is the same; 2-core CPU)
@pytest.mark.parametrize('lib, size, expected', [
    ('mmdet', (512, 512), [(128, 128), (64, 64), (32, 32), (16, 16)]),
    ('mmdet', (511, 511), [(128, 128), (64, 64), (32, 32), (16, 16)]),  # padded up to the patch size
    ('mmdet', (112, 137), [(28, 35), (14, 18), (7, 9), (4, 5)]),
    ('mmseg', (112, 137), [(28, 35), (14, 18), (7, 9), (4, 5)]),
])
def test_mmdet_mmseg_inference_sizes(lib, size, expected):
    out = shapes(build(lib), *size)
    assert out == [(1, 96 * 2**i, *hw) for i, hw in enumerate(expected)]


# ================================================================================================ mmpretrain
V1_CFG = dict(arch='tiny', img_size=224, patch_size=4, drop_path_rate=0.1)
# upstream's V2 tests use arch='b'; here only test_default_forward does (88 M parameters: the other checks do not
# depend on the width and run on a shared 2-core CPU), the rest use 'tiny' with upstream's other arguments
V2_UPSTREAM = dict(arch='b', img_size=256, patch_size=4, drop_path_rate=0.1)
V2_CFG = dict(V2_UPSTREAM, arch='tiny')


@pytest.mark.parametrize('v2', [False, True], ids=['v1', 'v2'])
class TestMMPretrainArch:

    def test_unknown_arch(self, v2):
        with pytest.raises(ValueError) as info:
            build('mmpretrain', v2=v2, **{**(V2_CFG if v2 else V1_CFG), 'arch': 'unknown'})
        assert "'unknown'" in str(info.value) and 'tiny' in str(info.value)

    def test_custom_arch_needs_every_key(self, v2):
        with pytest.raises((TypeError, ValueError)) as info:
            build('mmpretrain', v2=v2, **{**(V2_CFG if v2 else V1_CFG),
                                           'arch': dict(embed_dims=96, num_heads=[3, 6, 12, 16])})
        assert 'depths' in str(info.value)

    def test_custom_arch(self, v2):
        # upstream's custom arch (256 wide, heads 6 / 12 / 6 / 12) builds there but cannot run a forward: no stage
        # width divides by its head count. The plugin refuses it at construction.
        arch = dict(embed_dims=256, depths=[2, 2, 4, 2], num_heads=[6, 12, 6, 12])
        if v2:
            arch = dict(arch, depths=[2, 2, 6, 2], extra_norm_every_n_blocks=2)
        with pytest.raises((TypeError, ValueError)):
            build('mmpretrain', v2=v2, **{**(V2_CFG if v2 else V1_CFG), 'arch': arch})
        # the same structural checks with head counts that divide the widths
        depths, heads = [2, 2, 4, 2], [8, 16, 16, 32]
        arch = dict(embed_dims=256, depths=depths, num_heads=heads)
        if v2:
            arch['extra_norm_every_n_blocks'] = 0  # the value of every released V2 arch
        model = build('mmpretrain', v2=v2, **{**(V2_CFG if v2 else V1_CFG), 'arch': arch})
        sd = model.state_dict()
        for i in range(4):
            blocks = {k.split('.')[3] for k in sd if k.startswith(f'layers.{i}.blocks.')}
            assert len(blocks) == depths[i]
            qkv = sd[f'layers.{i}.blocks.0.attn.qkv.weight']
            assert qkv.shape == (3 * 256 * 2**i, 256 * 2**i)
            heads_of_stage = (sd[f'layers.{i}.blocks.0.attn.logit_scale'].shape[0] if v2 else
                              sd[f'layers.{i}.blocks.0.attn.relative_position_bias_table'].shape[1])
            assert heads_of_stage == heads[i]

    def test_unknown_arch_keys_are_refused(self, v2):
        arch = dict(embed_dims=96, depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24], mlp_ratio=4)
        msg = assert_refused('mmpretrain', ['mlp_ratio'], v2=v2, **{**(V2_CFG if v2 else V1_CFG), 'arch': arch})
        assert 'arch' in msg


def test_v2_extra_norm_every_n_blocks_is_refused():
    arch = dict(embed_dims=256, depths=[2, 2, 6, 2], num_heads=[8, 16, 16, 32], extra_norm_every_n_blocks=2)
    assert_refused('mmpretrain', ['extra_norm_every_n_blocks'], v2=True, **{**V2_CFG, 'arch': arch})


@pytest.mark.parametrize('v2', [False, True], ids=['v1', 'v2'])
class TestMMPretrainInit:

    def test_init_cfg_list_initialises_the_patch_embedding(self, v2):
        cfg = {**(V2_CFG if v2 else V1_CFG),
               'init_cfg': [dict(type='Kaiming', layer='Conv2d', mode='fan_in', nonlinearity='linear')]}
        model = build('mmpretrain', v2=v2, **cfg)
        before = model.patch_embed.proj.weight.detach().clone()
        model.init_weights()
        after = model.patch_embed.proj.weight.detach()
        assert not torch.allclose(before, after)
        fan_in = after[0].numel()  # Kaiming normal, linear gain: std = 1 / sqrt(fan_in)
        assert abs(after.std().item() * math.sqrt(fan_in) - 1) < 0.1

    def test_absolute_position_embedding(self, v2):
        cfg = {**(V2_CFG if v2 else V1_CFG), 'use_abs_pos_embed': True}
        model = build_or_refused('mmpretrain', ['use_abs_pos_embed'], v2=v2, **cfg)
        if model is None:
            return
        pos = dict(model.named_parameters())['absolute_pos_embed']
        side = cfg['img_size'] // 4
        assert pos.shape == (1, side * side, 96)
        assert torch.count_nonzero(pos) == 0  # zeros until init_weights, like upstream
        model.init_weights()
        assert torch.count_nonzero(pos) > 0
        # other input sizes work (upstream resizes the embedding)
        assert shapes(model, 256, 320)[-1][-2:] == (8, 10)

    def test_checkpoint_round_trip_strict(self, v2, tmp_path):
        # a small arch instead of upstream's tiny / base: the check is about keys, not size
        cfg = {**(V2_CFG if v2 else V1_CFG), 'arch': dict(embed_dims=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8])}
        model = build('mmpretrain', v2=v2, **cfg)
        model.init_weights()
        path = os.path.join(tmp_path, 'ckpt.pth')
        save_checkpoint(model.state_dict(), path)
        other = build('mmpretrain', v2=v2, **cfg)
        load_checkpoint(other, path, strict=True)
        for k, v in model.state_dict().items():
            assert torch.equal(v, other.state_dict()[k]), k


@pytest.mark.parametrize('v2', [False, True], ids=['v1', 'v2'])
class TestMMPretrainForward:

    def cfg(self, v2, **extra):
        return {**(V2_CFG if v2 else V1_CFG), **extra}

    def width(self, v2):
        return 96

    def test_default_forward(self, v2):
        size, cfg = (256, V2_UPSTREAM) if v2 else (224, V1_CFG)
        width = 128 if v2 else 96
        # plugin default out_indices=(0, 1, 2, 3); mmpretrain's default is (3,)
        out = shapes(build('mmpretrain', v2=v2, **cfg), size, size)
        assert out == [(1, width * 2**i, size // 4 // 2**i, size // 4 // 2**i) for i in range(4)]
        out = shapes(build('mmpretrain', v2=v2, **self.cfg(v2, out_indices=(3, ))), size, size)
        assert out == [(1, 8 * self.width(v2), size // 32, size // 32)]

    def test_window_12_at_384(self, v2):
        out = shapes(build('mmpretrain', v2=v2, **self.cfg(v2, window_size=12, out_indices=(3, ))), 384, 384)
        assert out == [(1, 8 * self.width(v2), 12, 12)]

    def test_window_larger_than_the_last_map(self, v2):
        """mmpretrain raises for pad_small_map=False when a map is smaller than the window; the plugin pads
        (True, the default) or shrinks the window like the official classification code (False)."""
        size = 256 if v2 else 224
        last = size // 32
        models = {}
        for pad in (True, False):
            models[pad] = build('mmpretrain', v2=v2, **self.cfg(v2, window_size=12, out_indices=(0, 3),
                                                                  pad_small_map=pad)).eval()
        randomize_(models[True], seed=1)  # V2's zero-initialised res-post-norms make every block the identity
        models[False].load_state_dict(models[True].state_dict())
        x = torch.randn(1, 3, size, size)
        with torch.no_grad():
            padded, shrunk = models[True](x), models[False](x)
        assert tuple(padded[1].shape) == tuple(shrunk[1].shape) == (1, 8 * self.width(v2), last, last)
        # stage 1 (56 or 64 px maps, larger than the window) is computed the same way; the last stage is not
        assert rel_err(padded[0], shrunk[0]) < FP32_PARITY  # same function: rounding only (conftest)
        assert rel_err(padded[1], shrunk[1]) > 10 * FP32_PARITY

    def test_multiple_outputs(self, v2):
        size = 256 if v2 else 224
        out = shapes(build('mmpretrain', v2=v2, **self.cfg(v2, out_indices=(0, 1, 2, 3))), size, size)
        assert out == [(1, self.width(v2) * s, size // 4 // s, size // 4 // s) for s in (1, 2, 4, 8)]
        assert len(out) == 4

    def test_with_cp_gives_the_same_training_step(self, v2):
        size = 128 if v2 else 96  # upstream: 256 / 224 (shape only; the sizes are covered by test_default_forward)
        ref = build('mmpretrain', v2=v2, **self.cfg(v2))
        cp = build('mmpretrain', v2=v2, **self.cfg(v2, with_cp=True))
        cp.load_state_dict(ref.state_dict())
        x = torch.randn(1, 3, size, size)
        grads = []
        for model in (ref, cp):
            model.train()
            torch.manual_seed(1)  # same stochastic-depth draws
            outs = model(x)
            assert tuple(outs[-1].shape) == (1, 8 * self.width(v2), size // 32, size // 32)
            sum(o.sum() for o in outs).backward()
            grads.append(model.patch_embed.proj.weight.grad.clone())
        assert rel_err(grads[1], grads[0]) < FP32_PARITY  # the same operations recomputed (conftest)

    def test_dynamic_input_shapes(self, v2):
        model = build('mmpretrain', v2=v2, **self.cfg(v2, pad_small_map=True, out_indices=(3, ))).eval()
        for h, w in [(224, 224), (256, 256), (256, 309)]:
            assert shapes(model, h, w) == [(1, 8 * self.width(v2), math.ceil(h / 32), math.ceil(w / 32))]


@pytest.mark.parametrize('v2', [False, True], ids=['v1', 'v2'])
class TestMMPretrainStructure:

    def cfg(self, v2, **extra):
        return {**(V2_CFG if v2 else V1_CFG), **extra}

    def test_drop_path_rate_decays_linearly(self, v2):
        model = build('mmpretrain', v2=v2, **self.cfg(v2, drop_path_rate=0.2))
        depths = [2, 2, 6, 2]  # tiny
        rates = block_drop_path_rates(model)
        assert len(rates) == sum(depths)  # one per block, shared by its attention and MLP branches
        for i, rate in enumerate(rates):
            assert rate == pytest.approx(0.2 / (sum(depths) - 1) * i)

    def test_batchnorm_norms_are_refused(self, v2):
        # upstream's norm_eval check builds a Swin with BatchNorm everywhere; the plugin's norms are LayerNorms
        assert_refused('mmpretrain', ['norm_cfg', 'stage_cfgs'], v2=v2,
                       **self.cfg(v2, norm_eval=True, norm_cfg=dict(type='BN'),
                                  stage_cfgs=dict(block_cfgs=dict(norm_cfg=dict(type='BN')))))

    def test_norm_eval_keeps_layer_norms_training(self, v2):
        model = build('mmpretrain', v2=v2, **self.cfg(v2, norm_eval=True))
        model.train()
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert norms and all(m.training for m in norms)  # norm_eval concerns BatchNorm only

    def test_first_stage_frozen(self, v2):
        # mmpretrain's frozen_stages=0 (patch embedding + stage 1) is the plugin's (mmdet's) frozen_stages=1
        model = build('mmpretrain', v2=v2, **self.cfg(v2, frozen_stages=1, out_indices=(0, 1, 2, 3)))
        model.init_weights()
        model.train()
        assert not model.patch_embed.training
        for prefix in ('patch_embed.', 'layers.0.blocks.', 'norm0.'):
            assert all(not p.requires_grad for p in params_with_prefix(model, prefix)), prefix
        for i in range(1, 4):
            for prefix in (f'layers.{i}.blocks.', f'norm{i}.'):
                assert all(p.requires_grad for p in params_with_prefix(model, prefix)), prefix
        # and the plugin's 0 freezes the patch embedding only
        model = build('mmpretrain', v2=v2, **self.cfg(v2, frozen_stages=0))
        model.train()
        assert all(not p.requires_grad for p in params_with_prefix(model, 'patch_embed.'))
        assert all(p.requires_grad for p in params_with_prefix(model, 'layers.0.blocks.'))
