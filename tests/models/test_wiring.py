"""Necks and heads wired from the backbone (:mod:`mmplugin.models.wiring`): mmdet's and mmseg's own configs of
other detectors and segmentors with only the backbone swapped to SwiftFormer-L1 or Swin-T and every ``in_channels``
that reads the backbone removed build through mmdet's ``init_detector`` / mmseg's ``init_model`` (the plugin loaded
by ``custom_imports``) and run one test step on a small image (random weights); the filled channels are the
backbone's own outputs, checked against a separately built backbone; explicit lists are left alone."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import _det_batch, _seg_batch
from mmengine.config import Config

from mmplugin.models.wiring import FROM_BACKBONE, needs_wiring, wire_channels
from mmplugin.utils.errors import ConfigWiringError

BACKBONES = {
    'swiftformer_l1': dict(type='mmplugin.SwiftFormer', arch='l1', drop_path_rate=0.0, init_cfg=None),
    'swin_t': dict(type='mmplugin.SwinTransformer', arch='tiny', drop_path_rate=0.0, init_cfg=None),
}
# (package, config, what reads the backbone); the backbone keeps as many outputs as the config's own
DETECTORS = [
    ('mmdet', 'faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'),
    ('mmdet', 'retinanet/retinanet_r50_fpn_1x_coco.py'),
    ('mmdet', 'fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py'),
    ('mmdet', 'deformable_detr/deformable-detr_r50_16xb2-50e_coco.py'),
    ('mmdet', 'dino/dino-4scale_r50_8xb2-12e_coco.py'),
    ('mmdet', 'rtmdet/rtmdet_tiny_8xb32-300e_coco.py'),
    ('mmdet', 'mask2former/mask2former_r50_8xb2-lsj-50e_coco.py'),
    ('mmseg', 'upernet/upernet_r50_4xb4-80k_ade20k-512x512.py'),
    ('mmseg', 'mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py'),
    ('mmseg', 'segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py'),
]
# the quick tier builds one detector and one segmentor with each backbone; the rest are 'heavy'
QUICK = {'faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 'upernet/upernet_r50_4xb4-80k_ade20k-512x512.py'}


def _mim_config(package: str, rel: str) -> Config:
    mod = __import__(package)
    return Config.fromfile(str(Path(mod.__file__).parent / '.mim' / 'configs' / rel))


def _swap(cfg: Config, backbone: str) -> tuple[Config, list[str]]:
    """``cfg`` with its backbone swapped (as many outputs as the original: the last stages) and every
    ``in_channels`` that reads the backbone deleted; returns the config and the deleted keys."""
    model = cfg.model
    n_out = len(model.backbone.get('out_indices', (0, 1, 2, 3)))
    model.backbone = dict(BACKBONES[backbone], out_indices=tuple(range(4 - n_out, 4)))
    model.pop('pretrained', None)
    removed = []
    if model.get('neck') is not None:
        neck = model.neck[0] if isinstance(model.neck, list) else model.neck
        neck.pop('in_channels')
        removed.append('neck')
    else:
        for key in ('decode_head', 'auxiliary_head', 'panoptic_head'):
            heads = model.get(key)
            for head in (heads if isinstance(heads, list) else [heads]):
                if head is not None and 'in_channels' in head:
                    head.pop('in_channels')
                    removed.append(key)
    cfg.custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
    return cfg, removed


def _own_channels(backbone_cfg) -> list[int]:
    from mmplugin.registry import MODELS
    kwargs = dict(backbone_cfg)
    cls = MODELS.get(kwargs.pop('type').split('.')[-1])  # the class itself: the default scope may be mmdet's
    with torch.no_grad():
        outs = cls(**kwargs).eval()(torch.zeros(1, 3, 64, 64))
    return [int(o.shape[1]) for o in outs]


CASES = [pytest.param(pkg, rel, bb, id=f'{bb}-{pkg}-{rel.split("/")[0]}',
                      marks=() if rel in QUICK else (pytest.mark.heavy, ))
         for pkg, rel in DETECTORS for bb in BACKBONES]


@pytest.mark.parametrize('package,rel,backbone', CASES)
def test_swapped_backbone_wires_its_neck_and_heads(package, rel, backbone):
    cfg, removed = _swap(_mim_config(package, rel), backbone)
    assert removed and needs_wiring(cfg.model)
    own = _own_channels(cfg.model.backbone)
    torch.manual_seed(0)
    if package == 'mmdet':
        from mmdet.apis import init_detector
        model = init_detector(cfg, None, device='cpu')
        data = _det_batch(model, size=256 if 'dino' in rel else 128)  # DINO keeps 900 of the tokens
    else:
        from mmseg.apis import init_model
        model = init_model(cfg, None, device='cpu')
        model.data_preprocessor.size = (128, 128)
        data = _seg_batch(size=128)
    wired = wire_channels(cfg.model, _registry(package))  # what the build above filled in
    if 'neck' in removed:
        neck = wired.neck[0] if isinstance(wired.neck, list) else wired.neck
        assert list(neck.in_channels) == own
    for key in set(removed) - {'neck'}:
        heads = wired[key] if isinstance(wired[key], list) else [wired[key]]
        for head in heads:
            index = head.get('in_index')
            want = own if index is None else ([own[i] for i in index] if isinstance(index, (list, tuple))
                                              else own[index])
            assert head.in_channels == want, (key, head.in_channels, want)
    model.eval()
    with torch.no_grad():
        results = model.test_step(data)
    assert len(results) == 2


def _registry(package):
    if package == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    return MODELS


def test_marker_and_explicit_lists():
    """:data:`FROM_BACKBONE` fills a neck of any kind; an explicit list is kept even when it is wrong (the tools'
    wiring check refuses it); a head that reads a neck cannot take the backbone's channels."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules()
    base = dict(type='MaskRCNN', backbone=dict(BACKBONES['swiftformer_l1']))
    marked = dict(base, neck=dict(type='SomeNeck', in_channels=FROM_BACKBONE))
    assert wire_channels(marked, MODELS)['neck']['in_channels'] == [48, 96, 192, 384]  # SwiftFormer-L1's widths
    explicit = dict(base, neck=dict(type='FPN', in_channels=[1, 2, 3, 4]))
    assert not needs_wiring(explicit) and wire_channels(explicit, MODELS) is explicit
    unknown = dict(base, neck=dict(type='SomeNeck'))
    assert not needs_wiring(unknown)  # a neck that may not read levels in order is not guessed for
    bad = dict(base, neck=dict(type='FPN'), decode_head=dict(type='FPNHead', in_channels=FROM_BACKBONE))
    with pytest.raises(ConfigWiringError, match='the model has a neck'):
        wire_channels(bad, MODELS)
    head = dict(type='EncoderDecoder', backbone=dict(BACKBONES['swiftformer_l1'], out_indices=(0, 1, 2, 3)),
                decode_head=dict(type='UPerHead', in_index=[0, 1, 2, 3]),
                auxiliary_head=dict(type='FCNHead', in_index=2))
    wired = wire_channels(copy.deepcopy(head), MODELS)
    assert wired['decode_head']['in_channels'] == [48, 96, 192, 384] and wired['auxiliary_head']['in_channels'] == 192
    with pytest.raises(ConfigWiringError, match='in_index=7'):
        wire_channels(dict(head, auxiliary_head=dict(type='FCNHead', in_index=7)), MODELS)


def test_plugin_tools_build_a_wired_config(tmp_path):
    """The plugin's own builder (every tool's) and mmengine's Runner take a config whose neck leaves in_channels to
    the backbone."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    from mmplugin.apis import build_model
    cfg = tmp_path / 'wired.py'
    cfg.write_text("_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']\n"
                   "custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)\n"
                   "model = dict(backbone=dict(_delete_=True, type='mmplugin.SwiftFormer', arch='xs', "
                   "out_indices=(1, 2, 3), init_cfg=None),\n"
                   f"             neck=dict(in_channels='{FROM_BACKBONE}'))\n")
    model = build_model(str(cfg))
    assert list(model.neck.in_channels) == list(model.backbone.out_channels) == [56, 112, 220]  # XS, stages 2-4
    assert [c.conv.in_channels for c in model.neck.lateral_convs] == [112, 220]  # RetinaNet's FPN starts at level 1
    init_default_scope('mmdet')
    runner_model = Runner.build_model(object.__new__(Runner), Config.fromfile(str(cfg)).model)  # what Runner runs
    assert list(runner_model.neck.in_channels) == [56, 112, 220]
