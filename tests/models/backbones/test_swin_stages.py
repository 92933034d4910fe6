"""Swin with a number of stages other than four (``len(depths)``, mmdet / mmseg meaning), and the Swin backbone
settings of mmdet's and mmseg's shipped configs with only the type swapped.

Reference: mmdet 3.3's ``SwinTransformer`` built from the same keywords, e.g. RTMDet P6's 5-stage Swin-B
(``rtmdet/rtmdet_l_swin_b_p6_4xb16-100e_coco.py``: ``depths=[2, 2, 18, 2, 1]``, ``num_heads=[4, 8, 16, 32, 64]``,
``strides=(4, 2, 2, 2, 2)``, ``out_indices=(1, 2, 3, 4)``). Both run in float64, so the outputs agree to rounding
on any CPU's kernels: conftest's ``FP64_PARITY`` of the largest output magnitude, per level.
"""
from __future__ import annotations

import os
import os.path as osp
import re

import pytest
import torch
from conftest import FP64_PARITY, outputs_in_float64, randomize_, rel_err
from mmengine.config import ConfigDict

from mmplugin.checkpoint import CheckpointError
from mmplugin.models import SwinTransformer
from mmplugin.models.backbones.swin.converter import convert_swin, plugin_to_mmdet_swin
from mmplugin.registry import MODELS

BOUND = FP64_PARITY
P6 = 'rtmdet/rtmdet_l_swin_b_p6_4xb16-100e_coco.py'
# RTMDet P6's backbone keywords, shrunken (width 16, fewer blocks) but with its five stages, strides and outputs
SMALL_P6 = dict(embed_dims=16, depths=[2, 2, 2, 2, 1], num_heads=[1, 2, 2, 4, 4], window_size=7,
                strides=(4, 2, 2, 2, 2), out_indices=(1, 2, 3, 4), drop_path_rate=0.0)


def _mmdet(**kw):
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    return MMDetSwin(**kw)


def _compare(ours, theirs, sizes):
    ours.eval()
    theirs.eval()
    errs = []
    for hw in sizes:
        x = torch.randn(1, 3, *hw)
        a, b = outputs_in_float64(ours, x), outputs_in_float64(theirs, x)
        assert len(a) == len(b)
        for level, (p, q) in enumerate(zip(a, b)):
            assert p.shape == q.shape, (hw, level)
            errs.append(rel_err(p, q))
            assert errs[-1] < BOUND, (hw, level, errs[-1])
    return errs


def test_five_stage_equals_mmdet_with_converted_weights(tmp_path):
    theirs = randomize_(_mmdet(**SMALL_P6), seed=5, scale=0.1)
    path = tmp_path / 'mmdet_p6.pth'
    torch.save({'state_dict': {'backbone.' + k: v for k, v in theirs.state_dict().items()}, 'meta': {}}, path)
    ours = SwinTransformer(**SMALL_P6, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    assert ours.num_stages == 5 and len(ours.layers) == 5
    assert ours.out_channels == [32, 64, 128, 256] and ours.out_strides == [8, 16, 32, 64]
    ours.init_weights()
    # the odd size pads at every stage; every map from stage 2 on is smaller than the window
    _compare(ours, theirs, [(130, 97), (64, 64)])
    # the pure converter gives a state dict that loads strictly
    converted, _ = convert_swin(theirs.state_dict(), version=1, out_indices=SMALL_P6['out_indices'])
    other = SwinTransformer(**SMALL_P6)
    missing, unexpected = other.load_state_dict(converted, strict=False)
    assert not unexpected and not [k for k in missing if not k.endswith(('relative_position_index', 'attn_mask'))]
    # back to mmdet's layout: key for key
    assert plugin_to_mmdet_swin(ours.state_dict()).keys() == {
        k for k in theirs.state_dict() if not k.endswith('relative_position_index')}


def test_three_stage_equals_mmdet():
    kw = dict(embed_dims=16, depths=[2, 2, 1], num_heads=[1, 2, 4], strides=(4, 2, 2), out_indices=(0, 1, 2),
              drop_path_rate=0.0)
    theirs = randomize_(_mmdet(**kw), seed=6, scale=0.1)
    ours = SwinTransformer(**kw)
    assert ours.num_stages == 3 and ours.out_strides == [4, 8, 16]
    converted, _ = convert_swin(theirs.state_dict(), version=1, out_indices=kw['out_indices'])
    ours.load_state_dict(converted, strict=False)
    assert converted.keys() == {k for k in ours.state_dict() if not k.endswith('relative_position_index')}
    _compare(ours, theirs, [(75, 51)])


def _official_4_stage_classifier(arch, seed=7):
    """Random weights in the official 4-stage classification layout (plugin names = official names), with the
    classifier norm and head and the official ``relative_position_index`` buffers."""
    from test_pretrained_init import official_relative_position_index
    src = randomize_(SwinTransformer(arch, drop_path_rate=0.0), seed=seed, scale=0.1)
    sd = {k: v for k, v in src.state_dict().items() if not re.match(r'norm\d\.', k)}
    c = arch['embed_dims'] * 8
    sd.update({'norm.weight': torch.rand(c) + 0.5, 'norm.bias': torch.randn(c), 'head.weight': torch.randn(10, c),
               'head.bias': torch.randn(10)})
    for i, depth in enumerate(arch['depths']):
        for j in range(depth):
            sd[f'layers.{i}.blocks.{j}.attn.relative_position_index'] = official_relative_position_index(7)
    return sd


def test_five_stage_from_a_four_stage_classifier_as_mmdet(tmp_path):
    """RTMDet P6's init_cfg is the 4-stage Swin-B ImageNet classifier: mmdet loads its four stages and the fifth
    stage (and the patch merging into it) start fresh; the plugin does the same and logs them as newly initialised."""
    four = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4])
    path = tmp_path / 'cls.pth'
    torch.save({'model': _official_4_stage_classifier(four)}, path)
    init = dict(type='Pretrained', checkpoint=str(path))
    theirs = _mmdet(**SMALL_P6, convert_weights=True, init_cfg=ConfigDict(init))  # mmdet reads attributes
    theirs.init_weights()
    ours = SwinTransformer(**SMALL_P6, init_cfg=init)
    plan, dropped = ours.plan_pretrained(str(path))
    new = sorted({re.match(r'(layers\.\d\.(?:downsample|blocks)|norm\d)', k).group(1) for k in plan.missing})
    assert new == ['layers.3.downsample', 'layers.4.blocks', 'norm1', 'norm2', 'norm3', 'norm4']
    assert {'norm.weight', 'norm.bias', 'head.weight'} <= set(dropped)
    ours.init_weights()
    ours.eval()
    theirs.eval()
    x = torch.randn(1, 3, 130, 97)
    a, b = outputs_in_float64(ours, x), outputs_in_float64(theirs, x)
    for level in range(3):  # stages 1-3: the checkpoint's weights and fresh output norms on both sides
        assert rel_err(a[level], b[level]) < BOUND, (level, rel_err(a[level], b[level]))
    assert a[3].shape == b[3].shape  # stage 4 is randomly initialised on both sides


def test_missing_released_stage_is_still_refused(tmp_path):
    arch = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4])
    sd = {k: v for k, v in _official_4_stage_classifier(arch).items()
          if not k.startswith(('layers.3.', 'layers.2.downsample.'))}
    path = tmp_path / 'three.pth'
    torch.save(sd, path)
    with pytest.raises(CheckpointError, match='does not fit'):
        SwinTransformer(arch, init_cfg=dict(type='Pretrained', checkpoint=str(path))).init_weights()


@pytest.mark.parametrize('kwargs,match', [
    (dict(SMALL_P6, strides=(4, 2, 2, 2)), r'only \(4, 2, 2, 2, 2\) is Swin with 5 stages'),
    (dict(SMALL_P6, num_heads=[1, 2, 2, 4]), r'num_heads must be an int or a list of 5'),
    (dict(SMALL_P6, window_size=[7, 7, 7, 7]), r'window_size must be an int or a list of 5'),
    (dict(SMALL_P6, out_indices=(5, )), r'out_indices must be distinct stage indices in 0\.\.4'),
    (dict(SMALL_P6, frozen_stages=6), r'frozen_stages must be an int in -1\.\.5'),
    (dict(embed_dims=16, depths=[], num_heads=[]), r'at least one stage'),
])
def test_five_stage_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SwinTransformer(**kwargs)


def test_rtmdet_p6_full_size_keys_and_shapes():
    """The shipped config's backbone, full size, with only the type swapped: mmdet's keys and shapes."""
    import mmdet
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', P6)).model.backbone.to_dict()
    assert cfg['depths'] == [2, 2, 18, 2, 1] and tuple(cfg['strides']) == (4, 2, 2, 2, 2)
    cfg['init_cfg'] = None
    theirs = _mmdet(**{k: v for k, v in cfg.items() if k != 'type'})  # mmdet's constructor needs real tensors
    with torch.device('meta'):  # shapes only: no second 150M-parameter allocation
        ours = MODELS.build(dict(cfg, type='mmplugin.SwinTransformer'))
    assert ours.out_channels == [256, 512, 1024, 2048] and ours.out_strides == [8, 16, 32, 64]
    want = {k: tuple(v.shape) for k, v in theirs.state_dict().items() if not k.endswith('relative_position_index')}
    got = {k: tuple(v.shape) for k, v in plugin_to_mmdet_swin(ours.state_dict()).items()}
    assert got == want


# ------------------------------------------------------------------------------------------------ upstream configs
def _upstream_swin_backbones() -> dict[str, tuple[str, dict]]:
    """Every distinct ``SwinTransformer`` backbone setting of mmdet's and mmseg's shipped configs (init_cfg and
    pretrained left out): ``repr(setting) -> (library, first config using it)``."""
    import mmdet
    import mmseg
    from mmengine.config import Config
    found: dict[str, tuple[str, dict]] = {}
    for lib, pkg in (('mmdet', mmdet), ('mmseg', mmseg)):
        root = osp.join(osp.dirname(pkg.__file__), '.mim', 'configs')
        for dirpath, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                path = osp.join(dirpath, name)
                if not name.endswith('.py') or '_base_' in path:
                    continue
                text = open(path).read()
                if 'swin' not in text.lower():
                    continue
                try:
                    model = Config.fromfile(path).get('model', {})
                except Exception:  # noqa: BLE001  configs needing uninstalled projects (e.g. mmpretrain)
                    continue
                for bb in _backbones(model):
                    if bb.get('type') in ('SwinTransformer', 'mmdet.SwinTransformer', 'mmseg.SwinTransformer'):
                        setting = {k: v for k, v in sorted(bb.items()) if k not in ('init_cfg', 'pretrained')}
                        found.setdefault(repr(setting), (lib, setting))
    return found


def _backbones(node):
    """Backbone dicts anywhere in a model config (detectors nest them, e.g. a teacher or an encoder)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == 'backbone' and isinstance(v, dict):
                yield dict(v)
            yield from _backbones(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _backbones(v)


@pytest.mark.slow
def test_every_upstream_swin_setting_builds_with_only_the_type_swapped():
    settings = _upstream_swin_backbones()
    from mmplugin.utils.stack import installed_stack
    # mmdet 3.3.0 (21) and mmseg 1.2.2 (14); the onedl forks (mmdet 3.5.1, mmseg 1.4.2) ship one setting more
    assert len(settings) == (35 if installed_stack() == 'openmmlab' else 36), sorted(settings)
    assert any(s.get('depths') == [2, 2, 18, 2, 1] for _, s in settings.values())  # RTMDet P6
    for key, (lib, setting) in settings.items():
        if lib == 'mmdet':
            from mmdet.models.backbones import SwinTransformer as Theirs
        else:
            from mmseg.models.backbones import SwinTransformer as Theirs
        kw = {k: v for k, v in setting.items() if k != 'type'}
        theirs = Theirs(**kw)  # mmdet's / mmseg's constructors need real tensors
        with torch.device('meta'):
            ours = MODELS.build(dict(setting, type='mmplugin.SwinTransformer'))
        want = {k: tuple(v.shape) for k, v in theirs.state_dict().items()
                if not k.endswith('relative_position_index')}
        got = {k: tuple(v.shape) for k, v in plugin_to_mmdet_swin(ours.state_dict()).items()}
        assert got == want, key
