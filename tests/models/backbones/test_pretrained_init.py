"""Initialisation from an ImageNet classification checkpoint, as the papers' detection / segmentation code does it.

References:

* Swin: mmdet 3.3's ``SwinTransformer`` with ``init_cfg=dict(type='Pretrained')`` and ``convert_weights=True``,
  given the same official-layout file: it converts the keys and loads with ``strict=False``, so the classifier's
  ``norm.*`` is ignored and ``norm3`` keeps its fresh LayerNorm (weight 1, bias 0). The official Swin detection and
  segmentation repositories load the same way.
* SwiftFormer: the official ``fork_feat`` backbone (Amshaker/SwiftFormer ``models/swiftformer.py``,
  ``SwiftFormer.init_weights``: ``self.load_state_dict(state_dict, False)``), i.e. the reference port
  :class:`mmplugin.reference.swiftformer.ReferenceSwiftFormer` built fresh and loaded with ``strict=False``:
  ``norm.*`` is ignored and the output BatchNorms ``norm0/2/4/6`` keep weight 1, bias 0, mean 0, variance 1.

Bounds (conftest's error analysis): the Swin comparisons run both models in float64 (``outputs_in_float64``), where
the same function computed by two implementations agrees to ``FP64_PARITY`` (9.1e-11) on any CPU's kernels; the
SwiftFormer comparisons run in float32 as ``test_swiftformer.py`` does, to ``FP32_PARITY`` (1.1e-4). What the tests
must catch is of order 1: the classifier-norm copy changes level 3 by ~100% (measured 1.1 for Swin, 1.0 for
SwiftFormer), so "differs" is asserted as > 0.1.
"""
from __future__ import annotations

import re

import pytest
import torch
from conftest import DATA, FP32_PARITY, FP64_PARITY, official_keys, outputs_in_float64, random_state_dict, rel_err
from mmengine.config import ConfigDict

from mmplugin.checkpoint import CheckpointError
from mmplugin.models import SwiftFormer, SwinTransformer
from mmplugin.models.backbones.swiftformer import convert_swiftformer
from mmplugin.models.backbones.swin import convert_swin
from mmplugin.reference.swiftformer import ReferenceSwiftFormer

SWIN_KEYS = DATA / 'official_keys_swin.txt'
SWIFT_KEYS = DATA / 'official_keys_swiftformer.txt'
SWIN_BOUND = FP64_PARITY  # float64 comparisons, see the module docstring
SWIFT_BOUND = FP32_PARITY


def official_relative_position_index(ws: int) -> torch.Tensor:
    """The official ``relative_position_index`` buffer: ``(dy + ws - 1) * (2 ws - 1) + (dx + ws - 1)`` for every
    pair of window positions, ``(ws*ws, ws*ws)``."""
    ys, xs = torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')
    coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, ws*ws)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
    return rel[..., 0] * (2 * ws - 1) + rel[..., 1]


def official_swin_t_classifier(seed=0) -> dict[str, torch.Tensor]:
    """Random weights in the official Swin-T classification layout (all 190 keys, persistent buffers included)."""
    sd = random_state_dict(official_keys(SWIN_KEYS, 'V1 tiny'), seed=seed)
    for k in sd:
        if k.endswith('relative_position_index'):
            sd[k] = official_relative_position_index(7)
    return sd


def _mmdet_swin(path, **kw):
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    theirs = MMDetSwin(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7,
                       drop_path_rate=0.0, convert_weights=True,
                       init_cfg=ConfigDict(type='Pretrained', checkpoint=str(path)), **kw)  # mmdet reads attributes
    theirs.init_weights()
    theirs.eval()  # mmdet's train() does not return self
    return theirs


def _ours(cls, path, **kw):
    model = cls(init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kw)
    model.init_weights()
    return model.eval()


@pytest.fixture(scope='module')
def swin_file(tmp_path_factory):
    path = tmp_path_factory.mktemp('swin') / 'swin_tiny_patch4_window7_224.pth'
    torch.save({'model': official_swin_t_classifier()}, path)
    return path


def test_index_formula_is_mmdet_s(swin_file):
    """The buffers written into the official-layout file are the ones mmdet regenerates (so loading them into
    mmdet, which keeps them persistent, changes nothing)."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    fresh = MMDetSwin(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7)
    got = fresh.stages[0].blocks[0].attn.w_msa.relative_position_index
    assert torch.equal(got, official_relative_position_index(7))


@pytest.mark.parametrize('hw', [(96, 128), (61, 97)])
def test_swin_from_official_classifier_equals_mmdet(swin_file, hw):
    theirs = _mmdet_swin(swin_file)
    ours = _ours(SwinTransformer, swin_file, arch='tiny', window_size=7, drop_path_rate=0.0)
    # norm3 starts fresh on both sides
    assert torch.equal(ours.norm3.weight, torch.ones(768)) and torch.equal(ours.norm3.bias, torch.zeros(768))
    assert torch.equal(theirs.norm3.weight, ours.norm3.weight) and torch.equal(theirs.norm3.bias, ours.norm3.bias)
    x = torch.randn(1, 3, *hw)
    a, b = outputs_in_float64(ours, x), outputs_in_float64(theirs, x)
    assert len(a) == len(b) == 4
    for level, (p, q) in enumerate(zip(a, b)):
        assert p.shape == q.shape, level
        assert rel_err(p, q) < SWIN_BOUND, (level, rel_err(p, q))


def test_swin_copy_classifier_norm_option(swin_file, tmp_path):
    sd = official_swin_t_classifier()
    ours = _ours(SwinTransformer, swin_file, arch='tiny', drop_path_rate=0.0, copy_classifier_norm=True)
    assert torch.equal(ours.norm3.weight, sd['norm.weight']) and torch.equal(ours.norm3.bias, sd['norm.bias'])
    theirs = _mmdet_swin(swin_file)
    x = torch.randn(1, 3, 96, 128)
    a, fresh_level3 = outputs_in_float64(ours, x), outputs_in_float64(theirs, x)[3]
    with torch.no_grad():
        theirs.norm3.weight.copy_(sd['norm.weight'])  # the option's meaning, applied to the reference by hand
        theirs.norm3.bias.copy_(sd['norm.bias'])
    b = outputs_in_float64(theirs, x)
    for level, (p, q) in enumerate(zip(a, b)):
        assert rel_err(p, q) < SWIN_BOUND, (level, rel_err(p, q))
    assert rel_err(a[3], fresh_level3) > 0.1  # the option really differs from the default
    # pure converter: the same option, the same two outcomes
    assert 'norm3.weight' not in convert_swin(dict(sd))[0]
    assert torch.equal(convert_swin(dict(sd), copy_classifier_norm=True)[0]['norm3.weight'], sd['norm.weight'])


def test_swin_copy_classifier_norm_cannot_be_honoured(swin_file, tmp_path):
    model = SwinTransformer('tiny', out_indices=(0, 1, 2), copy_classifier_norm=True,
                            init_cfg=dict(type='Pretrained', checkpoint=str(swin_file)))
    with pytest.raises(CheckpointError, match=r'copy_classifier_norm=True.*stage 3.*out_indices'):
        model.init_weights()
    no_norm = tmp_path / 'no_norm.pth'
    torch.save({k: v for k, v in official_swin_t_classifier().items() if not k.startswith('norm.')}, no_norm)
    model = SwinTransformer('tiny', copy_classifier_norm=True,
                            init_cfg=dict(type='Pretrained', checkpoint=str(no_norm)))
    with pytest.raises(CheckpointError, match=r'no classifier norm'):
        model.init_weights()
    with pytest.raises(TypeError, match='copy_classifier_norm must be a bool'):
        SwinTransformer('tiny', copy_classifier_norm='yes')


# ------------------------------------------------------------------------------------------------ SwiftFormer
def _official_fork_feat(sd, arch='xs'):
    """The official fork_feat backbone built fresh, then ``load_state_dict(state_dict, False)`` as its loader."""
    s = SwiftFormer.arch_zoo[arch]
    ref = ReferenceSwiftFormer(s['depths'], s['embed_dims'])
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    # (PyTorch does not report absent BatchNorm num_batches_tracked counters as missing)
    assert sorted(missing) == sorted(k for k in ref.state_dict()
                                     if re.match(r'norm[0246]\.', k) and not k.endswith('num_batches_tracked'))
    assert sorted(unexpected) == sorted(k for k in sd if k.startswith(('norm.', 'head.', 'dist_head.')))
    return ref.eval()


@pytest.fixture(scope='module')
def swift_file(tmp_path_factory):
    sd = random_state_dict(official_keys(SWIFT_KEYS, 'Full key list: SwiftFormer_XS'), seed=1)
    path = tmp_path_factory.mktemp('swift') / 'SwiftFormer_XS.pth'
    torch.save({'model': sd}, path)
    return path, sd


def test_swiftformer_from_official_classifier_follows_fork_feat(swift_file):
    path, sd = swift_file
    ref = _official_fork_feat(sd)
    ours = _ours(SwiftFormer, path, arch='xs')
    assert torch.equal(ours.norm3.running_var, torch.ones(220)) and torch.equal(ours.norm3.weight, torch.ones(220))
    x = torch.randn(1, 3, 96, 130)
    with torch.no_grad():
        a, b = ours(x), ref(x)
    for level, (p, q) in enumerate(zip(a, b)):
        assert p.shape == q.shape, level
        assert rel_err(p, q) < SWIFT_BOUND, (level, rel_err(p, q))


def test_swiftformer_copy_classifier_norm_option(swift_file):
    path, sd = swift_file
    ref = _official_fork_feat(sd)
    ours = _ours(SwiftFormer, path, arch='xs', copy_classifier_norm=True)
    x = torch.randn(1, 3, 96, 130)
    with torch.no_grad():
        fresh_level3 = ref(x)[3]
        ref.norm6.load_state_dict({k[len('norm.'):]: v for k, v in sd.items() if k.startswith('norm.')})
        a, b = ours(x), ref(x)
    for level, (p, q) in enumerate(zip(a, b)):
        assert rel_err(p, q) < SWIFT_BOUND, (level, rel_err(p, q))
    assert rel_err(a[3], fresh_level3) > 0.1
    assert 'norm3.running_mean' not in convert_swiftformer(dict(sd))[0]
    assert torch.equal(convert_swiftformer(dict(sd), copy_classifier_norm=True)[0]['norm3.running_mean'],
                       sd['norm.running_mean'])
    with pytest.raises(ValueError, match='copy_classifier_norm=True needs an output norm'):
        SwiftFormer('xs', out_norm_cfg=None, copy_classifier_norm=True)
    with pytest.raises(TypeError, match='copy_classifier_norm must be a bool'):
        SwiftFormer('xs', copy_classifier_norm=1)
