"""Users' own configs work with only the backbone type swapped.

* mmdet's ``swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py`` and mmseg's Swin-T UperNet ADE20K config, inherited through
  ``mmdet::`` / ``mmseg::`` with ``model.backbone.type`` changed to ``'mmplugin.SwinTransformer'`` and
  ``custom_imports`` added, build, run a training step, and with the same weights give the same backbone outputs as
  mmdet's / mmseg's own ``SwinTransformer`` built from the unchanged config (float64, max relative error
  < conftest.FP64_PARITY);
* mmseg's Semantic FPN ADE20K config (``sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py``, which inherits
  ``_base_/models/fpn_r50.py`` and with it ``model.pretrained='open-mmlab://resnet50_v1c'``) with
  ``mmplugin.SwiftFormer``: only the backbone dict and the neck channels change, and it builds and trains a step.

The tests only replace what needs the outside network (the URL ``init_cfg``) and shrink the input, not the config.
"""
from __future__ import annotations

import textwrap

import pytest
import torch
from conftest import FP64_PARITY, outputs_in_float64, randomize_, rel_err
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper

from mmplugin.models.backbones.swin.converter import plugin_to_mmdet_swin

pytestmark = pytest.mark.numeric  # rerun on older CPU kernel families by tools/run_tests.sh

MMDET_SWIN = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'
MMSEG_SWIN = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'
SWAP = """
_base_ = [{base!r}]
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(backbone=dict(type='mmplugin.SwinTransformer'))
"""
MMSEG_SEMFPN = 'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py'
SEMFPN = """
_base_ = ['mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.SwiftFormer', arch='l1', out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[48, 96, 192, 384]))
"""


def _config(tmp_path, text: str, name='cfg.py') -> Config:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return Config.fromfile(str(path))


def _original(tmp_path, base: str) -> Config:
    return _config(tmp_path, f'_base_ = [{base!r}]\n', 'original.py')


def _registry(lib: str):
    if lib == 'mmdet':
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    else:
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    return MODELS


def _det_batch(size=(96, 128)):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    h, w = size
    samples = []
    for i in range(2):
        s = DetDataSample(metainfo=dict(img_shape=size, ori_shape=size, pad_shape=size, scale_factor=(1., 1.),
                                        batch_input_shape=size, img_id=i))
        gt = InstanceData()
        gt.bboxes = torch.tensor([[10., 12., 60., 70.], [40., 5., 120., 50.]])
        gt.labels = torch.tensor([1, 7])
        masks = torch.zeros(2, h, w, dtype=torch.uint8)
        masks[0, 12:70, 10:60] = 1
        masks[1, 5:50, 40:120] = 1
        gt.masks = BitmapMasks(masks.numpy(), h, w)
        s.gt_instances = gt
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8) for _ in range(2)], data_samples=samples)


def _seg_batch(num_classes, size=64):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, size, size)))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8) for _ in range(2)],
                data_samples=samples)


def _train_step(model, data, optim_cfg) -> None:
    """One optimiser step; the loss is finite and the backbone's first weights move."""
    optim_cfg = optim_cfg.copy()
    if optim_cfg.get('type') == 'AmpOptimWrapper' and not torch.cuda.is_available():
        optim_cfg['type'] = 'OptimWrapper'
    optim = build_optim_wrapper(model, optim_cfg)
    model.train()
    before = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if p.requires_grad}
    losses = model.train_step(data, optim)
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total), losses
    first = next(iter(before))  # the stem / patch embedding: the gradient crossed the whole backbone
    assert not torch.equal(dict(model.backbone.named_parameters())[first], before[first]), first


def _same_backbone_outputs(ours, original_backbone_cfg, lib, sizes):
    """mmdet's / mmseg's SwinTransformer from the unchanged config, given the plugin backbone's weights."""
    cfg = original_backbone_cfg.copy()
    cfg.init_cfg = None
    theirs = _registry(lib).build(cfg)
    randomize_(ours, seed=3, scale=0.1)
    missing, unexpected = theirs.load_state_dict(plugin_to_mmdet_swin(ours.state_dict()), strict=False)
    assert not unexpected and all('relative_position_index' in k for k in missing), (missing, unexpected)
    ours.eval()
    theirs.eval()
    for hw in sizes:  # float64: the same function to rounding, on any CPU's kernels (conftest: FP64_PARITY)
        x = torch.randn(1, 3, *hw)
        a, b = outputs_in_float64(ours, x), outputs_in_float64(theirs, x)
        assert len(a) == len(b) == 4
        for i, (p, q) in enumerate(zip(a, b)):
            assert p.shape == q.shape, (hw, i)
            assert rel_err(p, q) < FP64_PARITY, (hw, i, rel_err(p, q))


@pytest.mark.parametrize('lib, base', [('mmdet', MMDET_SWIN), ('mmseg', MMSEG_SWIN)])
def test_swin_config_with_only_the_type_swapped(tmp_path, lib, base):
    cfg = _config(tmp_path, SWAP.format(base=base))
    original = _original(tmp_path, base)
    # the swap is the only difference: every other backbone key is the upstream one, untouched
    ours_bb, theirs_bb = cfg.model.backbone.to_dict(), original.model.backbone.to_dict()
    assert ours_bb.pop('type') == 'mmplugin.SwinTransformer' and theirs_bb.pop('type') == 'SwinTransformer'
    assert ours_bb == theirs_bb and theirs_bb['init_cfg']['checkpoint'].startswith('https://')
    cfg.model.backbone.init_cfg = None  # no outside network in tests
    model = revert_sync_batchnorm(_registry(lib).build(cfg.model))
    model.init_weights()
    assert type(model.backbone).__module__.startswith('mmplugin.')
    assert list(model.backbone.out_channels) == [96, 192, 384, 768]
    if lib == 'mmdet':
        data = _det_batch()
    else:
        model.data_preprocessor.size = (64, 64)  # shrink the input (the config crops 512 x 512)
        data = _seg_batch(cfg.model.decode_head.num_classes)
    model.eval()
    with torch.no_grad():
        assert len(model.test_step(data)) == 2
    _train_step(model, data, cfg.optim_wrapper)
    # the pretraining size, and an odd size that pads at every stage and has maps smaller than the window
    _same_backbone_outputs(model.backbone, original.model.backbone, lib, [(224, 224), (61, 97)])


def test_semantic_fpn_from_mmseg_base_with_swiftformer(tmp_path):
    cfg = _config(tmp_path, SEMFPN)
    original = _original(tmp_path, MMSEG_SEMFPN)
    assert cfg.model.pretrained == original.model.pretrained == 'open-mmlab://resnet50_v1c'  # from fpn_r50.py
    changed = {k for k in original.model if cfg.model[k] != original.model[k]}
    assert changed == {'backbone', 'neck'}
    assert {k for k in original.model.neck if cfg.model.neck[k] != original.model.neck[k]} == {'in_channels'}
    model = revert_sync_batchnorm(_registry('mmseg').build(cfg.model))
    model.init_weights()
    assert list(model.backbone.out_channels) == list(cfg.model.neck.in_channels)
    model.data_preprocessor.size = (64, 64)  # shrink the input (the config crops 512 x 512)
    data = _seg_batch(cfg.model.decode_head.num_classes)
    model.eval()
    with torch.no_grad():
        assert len(model.test_step(data)) == 2
    _train_step(model, data, cfg.optim_wrapper)
