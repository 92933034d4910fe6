"""The SwiftFormer paper's Table 3 comparison rows: EfficientFormer and PoolFormer pinned to literal ports of their
official dense backbones, every published layout loading, the twelve comparison configs building, training a step
and inferring, and official dense EfficientFormer checkpoints loading strictly into them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import FP32_PARITY, randomize_, rel_err
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm

from mmplugin.checkpoint import CheckpointError
from mmplugin.models import EfficientFormer, PoolFormer
from mmplugin.models.backbones import detect_family
from mmplugin.reference.efficientformer import EFFICIENTFORMER_SETTINGS, ReferenceEfficientFormer
from mmplugin.reference.poolformer import POOLFORMER_SETTINGS, ReferencePoolFormer

ROOT = Path(__file__).resolve().parents[3]
COMPARISON = sorted((ROOT / 'configs/comparison').glob('*.py'))
# Table 3 of arXiv 2303.15446: box AP, mask AP, mIoU
PAPER = {'resnet18': (34.0, 31.2, 32.9), 'poolformer_s12': (37.3, 34.6, 37.2), 'efficientformer_l1': (37.9, 35.4, 38.9),
         'resnet50': (38.0, 34.4, 36.7), 'poolformer_s24': (40.1, 37.0, 40.3), 'efficientformer_l3': (41.4, 38.1, 43.5)}


def _ref_ef(arch, resolution=25, seed=0):
    depths, widths, vit = EFFICIENTFORMER_SETTINGS[arch]
    return randomize_(ReferenceEfficientFormer(depths, widths, vit, resolution), seed).eval()


def _ref_pf(arch, seed=0):
    depths, widths, ls = POOLFORMER_SETTINGS[arch]
    return randomize_(ReferencePoolFormer(depths, widths, ls), seed).eval()


def _assert_close(ours, ref, x):
    with torch.no_grad():
        got, want = ours(x), ref(x)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert rel_err(a, b) < FP32_PARITY


# ---------------------------------------------------------------------------------------------- EfficientFormer
@pytest.mark.numeric
@pytest.mark.parametrize('arch', ['l1', 'l3'])
@pytest.mark.parametrize('size', [(224, 224), (160, 250), (97, 131)])
def test_efficientformer_equals_official_feat_model(arch, size):
    """All four levels against the official formulation with the same (official-layout) weights, at the ImageNet
    size (49 tokens), and at sizes whose token count needs the bicubic bias resize (non-divisible ones too)."""
    ref = _ref_ef(arch)
    ours = EfficientFormer(arch).eval()
    sd, dropped = ours.convert_state_dict(ref.state_dict())
    # the official feat model's unused classification bias and its derived index tables
    assert dropped and all(k.endswith(('attention_biases', 'attention_bias_idxs', 'attention_bias_idxs_seg'))
                           for k in dropped)
    ours.load_state_dict(sd, strict=True)
    _assert_close(ours, ref, torch.randn(2, 3, *size))


def test_efficientformer_segmentation_resolution_and_mismatch(tmp_path):
    """resolution=16 (official segmentation backbone) loads its (8, 256) table; a detection table (8, 625) does not
    fit it, and the error says which setting to change."""
    ref = _ref_ef('l1', resolution=16, seed=1)
    ours = EfficientFormer('l1', resolution=16).eval()
    ours.load_state_dict(ours.convert_state_dict(ref.state_dict())[0])
    _assert_close(ours, ref, torch.randn(1, 3, 128, 192))
    det = _ref_ef('l1', resolution=25)
    path = tmp_path / 'det.pth'
    torch.save({'state_dict': {'backbone.' + k: v for k, v in det.state_dict().items()}}, path)
    seg = EfficientFormer('l1', resolution=16, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match='resolution=16'):
        seg.init_weights()


def _official_classifier(ref):
    """An official ImageNet file of the same network: ``'model'`` container, classifier norm and heads, the 7x7
    classification bias as a parameter, no output norms and no dense bias table."""
    sd = {k: v for k, v in ref.state_dict().items()
          if not re.match(r'norm[0246]\.', k) and not k.endswith(('_seg', 'attention_bias_idxs'))}
    c = ref.norm6.num_channels
    sd.update({'norm.weight': torch.rand(c), 'norm.bias': torch.randn(c), 'head.weight': torch.randn(1000, c),
               'head.bias': torch.randn(1000), 'dist_head.weight': torch.randn(1000, c),
               'dist_head.bias': torch.randn(1000)})
    return {'model': sd}


def _to_mmpretrain(sd):
    """The same weights under mmpretrain.EfficientFormer's names (its documented layout: stem ConvModules,
    downsamples as block 0 of the next stage, ls1/ls2, classifier norm3 / head.head / head.dist_head)."""
    out = {}
    for k, v in sd.items():
        for a, b in (('patch_embed.0.', 'patch_embed.0.conv.'), ('patch_embed.1.', 'patch_embed.0.bn.'),
                     ('patch_embed.3.', 'patch_embed.1.conv.'), ('patch_embed.4.', 'patch_embed.1.bn.')):
            if k.startswith(a):
                k = b + k[len(a):]
                break
        m = re.match(r'network\.(\d+)\.(.*)', k)
        if m:
            n, rest = int(m.group(1)), m.group(2)
            if n % 2:
                rest = rest.replace('proj.', 'conv.').replace('norm.', 'bn.')
                k = f'network.{(n + 1) // 2}.0.{rest}'
            else:
                j, tail = rest.split('.', 1)
                k = f'network.{n // 2}.{int(j) + (1 if n else 0)}.{tail}'
        k = re.sub(r'layer_scale_([12])$', r'ls\1.weight', k)
        k = re.sub(r'^norm\.', 'norm3.', k)
        k = re.sub(r'^(dist_head|head)\.', r'head.\1.', k)
        out['backbone.' + k if not k.startswith('head.') else k] = v
    return {'state_dict': out}


@pytest.mark.numeric
@pytest.mark.parametrize('layout', ['official', 'mmpretrain'])
def test_efficientformer_imagenet_files_load_through_init_cfg(layout, tmp_path):
    """ImageNet files (official ``{'model': ...}`` and mmpretrain's) load through ``init_cfg``: classifier parts and
    the 7x7 classification bias dropped, the dense bias table starting at zero and the GroupNorm output norms fresh,
    which is what the official feat model computes with the same file."""
    ref = _ref_ef('l1', seed=2)
    ckpt = _official_classifier(ref)
    if layout == 'mmpretrain':
        ckpt = _to_mmpretrain(ckpt['model'])
    path = tmp_path / f'{layout}.pth'
    torch.save(ckpt, path)
    ours = EfficientFormer('l1', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ours.init_weights()
    ours.eval()
    assert detect_family(ours.state_dict()) is EfficientFormer
    with torch.no_grad():  # what the official loader leaves in the dense model: zero bias table, fresh norms
        for name, p in ref.named_parameters():
            if name.endswith('attention_biases_seg'):
                p.zero_()
        for i in (0, 2, 4, 6):
            getattr(ref, f'norm{i}').reset_parameters()
    _assert_close(ours, ref, torch.randn(1, 3, 128, 160))


def test_efficientformer_is_told_apart_from_swiftformer_and_poolformer():
    from mmplugin.models import SwiftFormer
    assert detect_family(EfficientFormer('l1').state_dict()) is EfficientFormer
    assert detect_family(_ref_ef('l3').state_dict()) is EfficientFormer
    assert detect_family(SwiftFormer('xs').state_dict()) is SwiftFormer
    assert detect_family(_ref_pf('s12').state_dict()) is PoolFormer
    with pytest.raises(ValueError, match='vit_num'):
        EfficientFormer(dict(depths=[1, 1, 1, 2], embed_dims=[16, 16, 32, 32], vit_num=3))
    with pytest.raises(ValueError, match='resolution'):
        EfficientFormer('l1', resolution=0)


# ---------------------------------------------------------------------------------------------- PoolFormer
@pytest.mark.numeric
@pytest.mark.parametrize('arch', ['s12', 's24'])
@pytest.mark.parametrize('size', [(224, 224), (256, 320), (227, 99)])
def test_poolformer_equals_official_fork_feat_model(arch, size):
    """Sides divisible by 4 and sides 3 mod 4 (the zero padding to a multiple of 4 is then exactly the official
    stem's own padding)."""
    ref = _ref_pf(arch)
    ours = PoolFormer(arch).eval()
    sd, dropped = ours.convert_state_dict(ref.state_dict())
    assert not dropped
    ours.load_state_dict(sd, strict=True)
    _assert_close(ours, ref, torch.randn(2, 3, *size))


def test_poolformer_pads_other_sizes_to_the_contract():
    out = PoolFormer('s12').eval()(torch.randn(1, 3, 129, 130))
    assert [tuple(o.shape[2:]) for o in out] == [(33, 33), (17, 17), (9, 9), (5, 5)]


@pytest.mark.numeric
@pytest.mark.parametrize('layout', ['official', 'mmpretrain'])
def test_poolformer_imagenet_files_load_through_init_cfg(layout, tmp_path):
    """The official raw classifier file (``norm``, ``head``) and mmpretrain's (``backbone.`` prefix, the classifier
    norm as ``norm6``, ``head.fc``): output norms fresh, as the official fork_feat loader leaves them."""
    ref = _ref_pf('s12', seed=3)
    sd = {k: v for k, v in ref.state_dict().items() if not re.match(r'norm[0246]\.', k)}
    if layout == 'official':
        ckpt = {**sd, 'norm.weight': torch.rand(512), 'norm.bias': torch.rand(512),
                'head.weight': torch.randn(1000, 512), 'head.bias': torch.randn(1000)}
    else:
        ckpt = {'state_dict': {**{'backbone.' + k: v for k, v in sd.items()}, 'backbone.norm6.weight': torch.rand(512),
                               'backbone.norm6.bias': torch.rand(512), 'head.fc.weight': torch.randn(1000, 512),
                               'head.fc.bias': torch.randn(1000)}}
    path = tmp_path / 'pf.pth'
    torch.save(ckpt, path)
    ours = PoolFormer('s12', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ours.init_weights()
    for i in (0, 2, 4, 6):
        getattr(ref, f'norm{i}').reset_parameters()
    _assert_close(ours.eval(), ref, torch.randn(1, 3, 128, 160))


# ---------------------------------------------------------------------------------------------- the configs
def _build(cfg):
    if 'semfpn' in cfg.filename:
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    return MODELS.build(cfg.model)


@pytest.mark.heavy
def test_every_row_has_both_configs_and_the_swiftformer_recipe():
    names = {p.name for p in COMPARISON}
    assert names == {f'{r}_{t}.py' for r in PAPER for t in ('maskrcnn_1x_coco', 'semfpn_40k_ade20k')}
    for p in COMPARISON:
        cfg = Config.fromfile(str(p))
        row = p.name.split('_maskrcnn')[0].split('_semfpn')[0]
        text = p.read_text()
        box, mask, miou = PAPER[row]
        assert (f'box AP {box}, mask AP {mask}' if 'maskrcnn' in p.name else f'mIoU {miou}') in text, p.name
        # SwiftFormer paper §4.4 / §4.5 (and the EfficientFormer recipe for what the paper leaves open)
        opt = cfg.optim_wrapper.optimizer
        assert (opt.type, opt.lr, opt.weight_decay, cfg.train_dataloader.batch_size) == ('AdamW', 2e-4, 1e-4, 4)
        if 'maskrcnn' in p.name:
            assert cfg.train_cfg.max_epochs == 12 and cfg.param_scheduler[1].milestones == [8, 11]
        else:
            assert cfg.train_cfg.max_iters == 40000 and cfg.crop_size == (512, 512)
        assert cfg.model.backbone.init_cfg.type == 'Pretrained'
        assert cfg.model.backbone.init_cfg.checkpoint.startswith('https://')
        if 'efficientformer' in row:
            assert cfg.model.backbone.resolution == (25 if 'maskrcnn' in p.name else 16)  # the official grids


QUICK = {'efficientformer_l1_maskrcnn_1x_coco.py', 'poolformer_s12_semfpn_40k_ade20k.py'}


@pytest.mark.parametrize('path', [p if p.name in QUICK else pytest.param(p, marks=pytest.mark.heavy)
                                  for p in COMPARISON], ids=[p.name for p in COMPARISON])
def test_comparison_config_builds_trains_and_infers(path):
    from conftest import _check_channels, _det_batch, _seg_batch
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(str(path))
    cfg.model.backbone.init_cfg = None  # published weights: not downloaded in tests
    model = revert_sync_batchnorm(_build(cfg))
    model.init_weights()
    _check_channels(cfg, model) if hasattr(model.backbone, 'out_channels') else None
    assert [m.in_channels for m in model.neck.lateral_convs] == list(cfg.model.neck.in_channels)
    if 'semfpn' in path.name:
        model.data_preprocessor.size = (64, 64)
        data = _seg_batch()
    else:
        data = _det_batch(model)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    model.eval()
    with torch.no_grad():
        assert len(model.test_step(data)) == 2
    model.train()
    losses = model.train_step(data, optim)
    assert torch.isfinite(sum(v for k, v in losses.items() if 'loss' in k)), losses


@pytest.mark.parametrize('task', ['maskrcnn_1x_coco', 'semfpn_40k_ade20k'])
def test_official_dense_efficientformer_checkpoint_loads_strictly(task, tmp_path):
    """A whole detector / segmentor checkpoint as the official mmdet 2.x / mmseg 0.x code saves it (backbone with
    the official feat names: ``norm0/2/4/6``, the learned ``attention_biases_seg`` of its grid, the unused
    classification bias buffers) loads strictly into the comparison config, and the backbone then computes what
    the official model computes with those weights."""
    from mmengine.runner import load_checkpoint

    from mmplugin.loading.fit import check_checkpoint_fits
    cfg = Config.fromfile(str(ROOT / f'configs/comparison/efficientformer_l1_{task}.py'))
    cfg.model.backbone.init_cfg = None
    model = revert_sync_batchnorm(_build(cfg))
    ref = _ref_ef('l1', resolution=cfg.model.backbone.resolution, seed=4)
    sd = {**{k: v for k, v in model.state_dict().items() if not k.startswith('backbone.')},
          **{'backbone.' + k: v for k, v in ref.state_dict().items()}}
    assert check_checkpoint_fits(model, {'state_dict': sd}) is None
    path = tmp_path / 'official_dense.pth'
    torch.save({'state_dict': sd, 'meta': {}}, path)
    load_checkpoint(model, str(path), map_location='cpu', strict=True)
    _assert_close(model.backbone.eval(), ref, torch.randn(1, 3, 96, 128))


@pytest.mark.heavy
def test_table3_measurement_rows_ratios_and_picture(tmp_path):
    """The comparison command's core on two rows (backbones only): counts from the models, ratios to SwiftFormer-L1
    (1 for itself), the paper's accuracy beside them, and the picture written."""
    import cv2

    from mmplugin.analysis.table3 import ROWS, format_table, measure, plot
    rows = measure(rows=[r for r in ROWS if r.name in ('EfficientFormer-L1', 'SwiftFormer-L1')], rounds=1,
                   root=str(ROOT), whole=False)
    by = {r['name']: r for r in rows}
    ef, sf = by['EfficientFormer-L1'], by['SwiftFormer-L1']
    assert sf['backbone_det_x'] == 1.0 and ef['backbone_det_x'] == pytest.approx(
        sf['backbone_ms_det'] / ef['backbone_ms_det'])
    assert ef['params_m'] == pytest.approx(sum(p.numel() for p in EfficientFormer('l1').parameters()) / 1e6)
    assert ef['gmacs_det'] > ef['gmacs_seg'] > 0 and ef['det_ms'] is None
    assert (ef['box_ap'], ef['miou'], sf['box_ap']) == (37.9, 38.9, 41.2)
    text = format_table(rows)
    assert '| EfficientFormer-L1 |' in text and '37.9 / 35.4' in text
    img = cv2.imread(plot(rows, str(tmp_path / 't3.png')))
    assert img is not None and img.shape[1] > 600
