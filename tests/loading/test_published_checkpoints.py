"""Whole-model checkpoints in every published layout load into the plugin's configs, and each plugin config with a
published counterpart builds the counterpart's model.

Layouts (random weights written in each, nothing downloaded):

* ``mmdet`` / ``mmseg``: mmdet 3.x's and mmseg 1.x's model zoos, i.e. the ``state_dict`` of the counterpart built
  from mmdet's / mmseg's own shipped config with mmdet's ``SwinTransformer`` (``patch_embed.projection``,
  ``stages.i.blocks.j.attn.w_msa.*`` with the persistent ``relative_position_index``, ``nn.Unfold`` merge order);
* ``official``: the official Swin detection and segmentation repositories (mmdet 2.11 / mmseg 0.11 era,
  SwinTransformer/Swin-Transformer-Object-Detection @c7b2011 and SwinTransformer/Swin-Transformer-Semantic-
  Segmentation @87e6f90, mmdet/models/backbones/swin_transformer.py and mmseg/models/backbones/
  swin_transformer.py there): the official backbone names plus one persistent ``relative_position_index``
  (window^2 x window^2) per block. Their necks and heads (mmdet 2.11 ``RPNHead.rpn_conv/rpn_cls/rpn_reg``,
  ``ConvFCBBoxHead.shared_convs/shared_fcs/fc_cls/fc_reg`` with ``num_classes + 1`` logits, ``FCNMaskHead.convs/
  upsample/conv_logits``; mmseg 0.11 ``UPerHead.psp_modules/bottleneck/lateral_convs/fpn_convs/fpn_bottleneck/
  conv_seg``, ``FCNHead.convs``) have the names and shapes of mmdet 3.x's / mmseg 1.x's, so the file is the
  counterpart's state dict with the backbone part in the official layout;
* ``plugin``: the plugin's own files.

Counterparts: mmdet's / mmseg's shipped configs where they exist; for the official-repository-only Cascade Mask R-CNN
models, a port of the official config (``_CASCADE_PORT`` below). The full-size key-fit check runs for every pair
(keys and shapes only, weights left uninitialised); the prediction checks run shrunk models (the same backbone
width / depth and test-time limits on both sides) through each config's own test pipeline on one synthetic image and
print the largest differences.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FP32_PARITY, rel_err
from mmengine.config import Config

from mmplugin.loading.fit import check_checkpoint_fits, strict_model_state_dict
from mmplugin.loading.whole_model import convert_model_state_dict
from mmplugin.models.backbones.swin.converter import convert_swin
from mmplugin.models.layers.fusion import onednn_fusion_disabled
from mmplugin.reference.swiftformer import ReferenceSwiftFormer

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / 'configs'

# Port of SwinTransformer/Swin-Transformer-Object-Detection @c7b20110addde0f74b1fbf812b403d16a59a87a9
# configs/swin/cascade_mask_rcnn_swin_{tiny,small,base}_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py
# (model part; mmdet 2.x -> 3.x names: embed_dim -> embed_dims, ape -> use_abs_pos_embed, use_checkpoint -> with_cp)
# on mmdet 3.x's Cascade Mask R-CNN, whose test pipeline (1333x800, keep ratio) is the official one's.
_CASCADE_PORT = """
_base_ = ['mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py', 'mmdet::_base_/datasets/coco_instance.py',
          'mmdet::_base_/default_runtime.py']


def _head(stds):
    return dict(type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1, in_channels=256, conv_out_channels=256,
                fc_out_channels=1024, roi_feat_size=7, num_classes=80,
                bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.], target_stds=stds),
                reg_class_agnostic=False, reg_decoded_bbox=True, norm_cfg=dict(type='SyncBN', requires_grad=True),
                loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                loss_bbox=dict(type='GIoULoss', loss_weight=10.0))


model = dict(
    backbone=dict(_delete_=True, type='SwinTransformer', embed_dims={dim}, depths={depths}, num_heads={heads},
                  window_size=7, mlp_ratio=4, qkv_bias=True, qk_scale=None, drop_rate=0., attn_drop_rate=0.,
                  drop_path_rate={dpr}, use_abs_pos_embed=False, patch_norm=True, out_indices=(0, 1, 2, 3),
                  with_cp=False),
    neck=dict(in_channels={channels}),
    roi_head=dict(bbox_head=[_head([0.1, 0.1, 0.2, 0.2]), _head([0.05, 0.05, 0.1, 0.1]),
                             _head([0.033, 0.033, 0.067, 0.067])]))
del _head
"""
_ARCH = {'t': (96, [2, 2, 6, 2], [3, 6, 12, 24]), 's': (96, [2, 2, 18, 2], [3, 6, 12, 24]),
         'b': (128, [2, 2, 18, 2], [4, 8, 16, 32])}
# Models a plugin config mirrors for which no Swin checkpoint is published: the counterpart is the same config with
# mmdet's SwinTransformer, i.e. what a user who trained it with stock mmdet has (mmdet-layout weights).
_SWAP_TO_MMDET = """
_base_ = ['{plugin}']
model = dict(backbone=dict(_delete_=True, type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                           num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=0.2, out_indices={out}))
"""
# A user's drop-in config: mmdet's RetinaNet Swin-T with only the backbone type swapped (README "Coming from mmdet").
_RETINANET_SWAP = """
_base_ = ['mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(backbone=dict(type='mmplugin.SwinTransformer', init_cfg=None))
"""


@pytest.fixture(autouse=True, scope='module')
def _index_model_zoo_once():
    """mmengine resolves every ``mmdet::`` / ``mmseg::`` config name by parsing all of the package's ~700 metafiles
    again; index them once per package for this module (same result, seconds less per config)."""
    import os.path as osp

    import mmengine.config.utils as cfg_utils
    from mmengine.fileio import load
    original, index = cfg_utils._get_cfg_metainfo, {}

    def metainfo(package_path: str, cfg_path: str) -> dict:
        if package_path not in index:
            found: dict = {}
            for meta in load(osp.join(package_path, '.mim', 'model-index.yml'))['Import']:
                for model in load(osp.join(package_path, '.mim', meta)).get('Models', []):
                    if 'Config' in model:
                        found.setdefault(model['Config'].partition('/')[-1], model)
            index[package_path] = found
        if cfg_path not in index[package_path]:
            return original(package_path, cfg_path)  # its error message
        return index[package_path][cfg_path]

    cfg_utils._get_cfg_metainfo = metainfo
    yield
    cfg_utils._get_cfg_metainfo = original


def _cascade_port(arch: str, dpr: float) -> str:
    dim, depths, heads = _ARCH[arch]
    return _CASCADE_PORT.format(dim=dim, depths=depths, heads=heads, dpr=dpr,
                                channels=[dim, dim * 2, dim * 4, dim * 8])


# (plugin config, counterpart: 'mmdet::...' / 'mmseg::...' shipped config or config text, what it is, published
# whole-model layouts)
COUNTERPARTS = [
    ('swin/swin_t_maskrcnn_1x_coco.py', 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', 'mmdet zoo',
     ('mmdet', 'official')),
    ('swin/swin_t_maskrcnn_3x_coco.py', 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py', 'mmdet zoo',
     ('mmdet', 'official')),
    ('swin/swin_s_maskrcnn_3x_coco.py', 'mmdet::swin/mask-rcnn_swin-s-p4-w7_fpn_amp-ms-crop-3x_coco.py', 'mmdet zoo',
     ('mmdet', 'official')),
    ('swin/swin_t_cascade_maskrcnn_3x_coco.py', _cascade_port('t', 0.2), 'official repo port', ('official', )),
    ('swin/swin_s_cascade_maskrcnn_3x_coco.py', _cascade_port('s', 0.2), 'official repo port', ('official', )),
    ('swin/swin_b_cascade_maskrcnn_3x_coco.py', _cascade_port('b', 0.3), 'official repo port', ('official', )),
    ('swin/swin_t_upernet_160k_ade20k.py',
     'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
     'mmseg zoo', ('mmseg', 'official')),
    ('swin/swin_s_upernet_160k_ade20k.py',
     'mmseg::swin/swin-small-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
     'mmseg zoo', ('mmseg', 'official')),
    ('swin/swin_b_upernet_160k_ade20k.py',
     'mmseg::swin/swin-base-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
     'mmseg zoo', ('mmseg', 'official')),
    ('swin/swin_t_atss_3x_coco.py',
     _SWAP_TO_MMDET.format(plugin=CONFIGS / 'swin/swin_t_atss_3x_coco.py', out=(1, 2, 3)),
     'same config, mmdet Swin', ('mmdet', )),
    ('swin/swin_t_sparse_rcnn_3x_coco.py',
     _SWAP_TO_MMDET.format(plugin=CONFIGS / 'swin/swin_t_sparse_rcnn_3x_coco.py', out=(0, 1, 2, 3)),
     'same config, mmdet Swin', ('mmdet', )),
    (_RETINANET_SWAP, 'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py', 'mmdet zoo', ('mmdet', )),
    # the same models as rows 2 and 9, published a second time (mixed-precision training; ImageNet-22K start)
    ('swin/swin_t_maskrcnn_3x_coco.py', 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_amp-ms-crop-3x_coco.py', 'mmdet zoo',
     ('mmdet', )),
    ('swin/swin_b_upernet_160k_ade20k.py',
     'mmseg::swin/swin-base-patch4-window7-in22k-pre_upernet_8xb2-160k_ade20k-512x512.py',
     'mmseg zoo', ('mmseg', )),
]


def _name(spec: str) -> str:
    if spec.endswith('.py') and '\n' not in spec:
        return spec.split('::')[-1]
    if 'cascade-mask-rcnn' in spec:
        return 'official cascade_mask_rcnn_swin_* port'
    if 'retinanet' in spec:
        return 'retinanet_swin-t drop-in (type swapped)'
    return 'same config with mmdet SwinTransformer'


def _config(spec: str, tmp_path: Path, name: str) -> Config:
    if '\n' in spec:
        path = tmp_path / f'{name}.py'
        path.write_text(textwrap.dedent(spec))
        return Config.fromfile(str(path))
    if spec.startswith(('mmdet::', 'mmseg::')):
        path = tmp_path / f'{name}.py'
        path.write_text(f'_base_ = [{spec!r}]\n')
        return Config.fromfile(str(path))
    return Config.fromfile(str(CONFIGS / spec))


def _scope(cfg: Config):
    scope = cfg.get('default_scope', 'mmdet')
    if scope == 'mmseg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    return MODELS


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights that keep a deep detector's activations in range (``conftest.randomize_``'s fixed scale makes
    them explode through FPN + heads): matrices and kernels ~ N(0, 1 / fan_in), norm gains ~ 1 + N(0, 0.1^2),
    biases ~ N(0, 0.1^2), BatchNorm statistics near (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or 'relative_coords_table' in name or name.startswith('data_preprocessor.'):
                continue  # the preprocessor's mean / std are configuration, not weights
            if 'init_proposal_bboxes' in name:  # Sparse R-CNN's start boxes: the whole image (its own init_weights)
                p[:, :2], p[:, 2:] = 0.5, 1.0
                continue
            noise = torch.randn(p.shape, generator=g)
            if name.endswith('running_var'):
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.75)
            elif p.ndim >= 2:
                p.copy_(noise / (p[0].numel() ** 0.5))
            elif name.endswith('weight'):
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model


@contextlib.contextmanager
def _no_init():
    """Build without filling weights (``torch.nn.init`` functions do nothing): for key and shape checks of full-size
    models, whose memory is then never touched. (mmdet's Swin calls ``.item()`` while building, so the meta device
    cannot be used.)"""
    names = [n for n in dir(torch.nn.init) if n.endswith('_') and not n.startswith('_')]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda t, *a, **k: t)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def _build(cfg: Config, weights: bool = True):
    models = _scope(cfg)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.get('backbone', {}).pop('init_cfg', None)
    model_cfg.pop('pretrained', None)
    with (contextlib.nullcontext() if weights else _no_init()):
        model = models.build(model_cfg)
    return model.eval()


def _official_index(ws: int) -> torch.Tensor:
    """The official ``relative_position_index`` buffer of a window-``ws`` block: (ws^2, ws^2) long."""
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
    return rel[..., 0] * (2 * ws - 1) + rel[..., 1]


def official_layout(openmmlab_sd: dict[str, torch.Tensor], window: int = 7) -> dict[str, torch.Tensor]:
    """Whole-model state dict in the official Swin detection / segmentation repositories' layout, from the
    OpenMMLab one: backbone in official names (patch-merging channel order included) plus the persistent
    ``relative_position_index`` buffers; neck and heads as they are."""
    backbone = {k[len('backbone.'):]: v for k, v in openmmlab_sd.items() if k.startswith('backbone.')}
    out_indices = sorted(int(m.group(1)) for k in backbone if (m := re.match(r'norm(\d+)\.weight$', k)))
    official, _ = convert_swin(backbone, version=1, out_indices=out_indices)
    for k in [k for k in official if k.endswith('attn.relative_position_bias_table')]:
        index = _official_index(window)
        official[k.replace('relative_position_bias_table', 'relative_position_index')] = index
    return {**{'backbone.' + k: v for k, v in official.items()},
            **{k: v for k, v in openmmlab_sd.items() if not k.startswith('backbone.')}}


def _layouts(counterpart_sd: dict[str, torch.Tensor], published: tuple[str, ...]) -> dict[str, dict]:
    out = {}
    for layout in published:
        out[layout] = counterpart_sd if layout in ('mmdet', 'mmseg') else official_layout(counterpart_sd)
    return out


# ---------------------------------------------------------------------------------------------- full-size key fit
_FAST_KEYFIT = {0, 3, 6, 11}  # one per layout family and counterpart kind; the others are larger or repeat them


@pytest.mark.parametrize('plugin,counterpart,kind,published', [
    pytest.param(*row, marks=() if i in _FAST_KEYFIT else pytest.mark.slow,
                 id=f'{i}-' + (row[0] if '\n' not in row[0] else 'retinanet_swap'))
    for i, row in enumerate(COUNTERPARTS)])
def test_full_size_key_fit(plugin, counterpart, kind, published, tmp_path):
    """Every published layout of the counterpart fits the plugin config's model key for key and shape for shape
    after conversion (built without initialising the weights), and nothing else than the backbone is converted."""
    ours = _build(_config(plugin, tmp_path, 'plugin'), weights=False)
    theirs = _build(_config(counterpart, tmp_path, 'counterpart'), weights=False)
    counterpart_sd = theirs.state_dict()
    own = ours.state_dict()
    # the counterpart's neck and heads are the plugin model's, key for key and shape for shape
    heads = {k: tuple(v.shape) for k, v in counterpart_sd.items() if not k.startswith('backbone.')}
    assert heads == {k: tuple(v.shape) for k, v in own.items() if not k.startswith('backbone.')}
    for layout, sd in {**_layouts(counterpart_sd, published), 'plugin': own}.items():
        problem = check_checkpoint_fits(ours, {'state_dict': sd})
        conversion = convert_model_state_dict(ours, sd)
        fits = 'fits' if problem is None else problem
        print(f'KEYFIT {_name(plugin) if chr(10) not in plugin else "retinanet_swin-t drop-in"} <- {layout} '
              f'({_name(counterpart)}): {len(sd)} keys -> {len(conversion.state_dict)}: {fits}')
        assert problem is None, f'{layout}: {problem}'
        assert conversion.changed == (layout != 'plugin')
        converted = conversion.state_dict
        assert {k: tuple(v.shape) for k, v in converted.items() if k in own or not k.endswith('num_batches_tracked')} \
            == {k: tuple(v.shape) for k, v in own.items() if k in converted or not k.endswith('num_batches_tracked')}


@pytest.mark.parametrize('plugin,counterpart', [
    pytest.param(row[0], row[1], id=f'{i}-' + (row[0] if '\n' not in row[0] else 'retinanet_swap'))
    for i, row in enumerate(COUNTERPARTS)])
def test_test_time_settings_equal_counterpart(plugin, counterpart, tmp_path):
    """Every pair, also those whose predictions are not compared (the same models as a compared pair but for
    backbone size and training): the test pipeline, the test-time settings and the data preprocessor are the
    counterpart's, so with the same weights the test-time model and its inputs are the same."""
    pcfg, ccfg = _config(plugin, tmp_path, 'plugin'), _config(counterpart, tmp_path, 'counterpart')
    assert pcfg.test_dataloader.dataset.pipeline == ccfg.test_dataloader.dataset.pipeline
    assert pcfg.model.test_cfg == ccfg.model.test_cfg
    assert pcfg.model.data_preprocessor == ccfg.model.data_preprocessor


def test_full_size_key_fit_covers_every_counterpart_config():
    """Every plugin Swin detection / segmentation config with a published counterpart is in the table; the ones
    left out have none (Swin V2: no official or OpenMMLab detector / segmentor; Swin-S/B Mask R-CNN 1x and Swin-B
    Mask R-CNN 3x: no published checkpoint; HTC++: weights and configs never released)."""
    listed = {p for p, *_ in COUNTERPARTS}
    without = {'swin/swin_s_maskrcnn_1x_coco.py', 'swin/swin_b_maskrcnn_1x_coco.py', 'swin/swin_b_maskrcnn_3x_coco.py',
               'swin/swin_b_htcpp_6x_coco.py', 'swin/swin_l_htcpp_6x_coco.py',
               'swin/swin_l_htcpp_nosemantic_6x_coco.py'}
    swin = {f'swin/{p.name}' for p in (CONFIGS / 'swin').glob('swin_*.py')}
    assert swin - listed == without


# ---------------------------------------------------------------------------------------------- predictions
_SMALL = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])


def _shrink(cfg: Config, det: bool) -> Config:
    """The same reductions on both sides: a narrow, shallow Swin (set in each backbone's own arguments), few
    proposals / detections, a small test scale. Neck and heads stay as configured."""
    cfg = copy.deepcopy(cfg)
    bb = cfg.model.backbone
    out = tuple(bb.get('out_indices', (0, 1, 2, 3)))
    if bb.type.startswith('mmplugin.') and 'embed_dims' not in bb:
        bb.arch = dict(_SMALL)
    else:
        bb.update(_SMALL)
    chans = [_SMALL['embed_dims'] * 2**i for i in out]
    if det:
        cfg.model.neck.in_channels = chans
        tc = cfg.model.test_cfg
        if tc.get('rpn') is not None:
            tc.rpn.update(nms_pre=200, max_per_img=20)
            tc.rcnn.update(max_per_img=10, score_thr=0.0)
        elif 'rcnn' in tc:  # query-based (Sparse R-CNN): the proposals are learned; keep the top 10
            tc.rcnn.update(max_per_img=10)
        else:
            tc.update(nms_pre=200, max_per_img=10, score_thr=0.0)
    else:
        cfg.model.decode_head.in_channels = chans
        cfg.model.auxiliary_head.in_channels = chans[2]
    for t in cfg.test_dataloader.dataset.pipeline:
        if t.type == 'Resize':
            t.scale = (160, 128) if det else (256, 96)
    cfg.test_dataloader.dataset.pipeline = [t for t in cfg.test_dataloader.dataset.pipeline
                                            if t.type != 'LoadAnnotations']
    return cfg


def _run_pipeline(cfg: Config, img_path: Path):
    from mmcv.transforms import Compose
    from mmengine.dataset import pseudo_collate
    _scope(cfg)
    pipeline = Compose(copy.deepcopy(cfg.test_dataloader.dataset.pipeline))
    data = pipeline(dict(img_path=str(img_path), img_id=0, reduce_zero_label=True, seg_fields=[]))
    return pseudo_collate([data])


def _image(tmp_path: Path) -> Path:
    import cv2
    rng = np.random.default_rng(0)
    img = (rng.random((96, 120, 3)) * 255).astype(np.uint8)
    img[20:70, 30:90] = (200, 40, 40)
    path = tmp_path / 'img.png'
    cv2.imwrite(str(path), img)
    return path


def _in_order_of(pa, pb):
    """``pb``'s detections in ``pa``'s order. A detector lists its detections by score, and two whose scores agree
    to the rounding can come out in either order (Sparse R-CNN on a randomised model, AMD EPYC family 25 model 17:
    two of ten swapped, their scores within 1e-6). So each of ``pa``'s is paired one to one with one of ``pb``'s, the
    nearest by box, score and label; the differences below then bound the paired values as before, so a swap is
    accepted only between detections whose boxes, scores and labels all agree within the tolerances."""
    from scipy.optimize import linear_sum_assignment
    assert len(pa) == len(pb)
    if len(pa) == 0:
        return pb
    cost = (torch.cdist(pa.bboxes.double(), pb.bboxes.double(), p=float('inf'))
            + (pa.scores.double()[:, None] - pb.scores.double()[None]).abs()
            + 1e9 * (pa.labels[:, None] != pb.labels[None]).double())
    rows, cols = linear_sum_assignment(cost.numpy())
    assert (rows == np.arange(len(pa))).all()
    return pb[torch.as_tensor(cols)]


def _differences(a, b, det: bool) -> dict[str, float]:
    if det:
        pa = a.pred_instances
        pb = _in_order_of(pa, b.pred_instances)
        assert torch.equal(pa.labels, pb.labels)
        out = {'bboxes': (pa.bboxes - pb.bboxes).abs().max().item(),
               'scores': (pa.scores - pb.scores).abs().max().item(), 'labels': 0.0}
        if 'masks' in pa:
            out['masks'] = (pa.masks != pb.masks).float().mean().item()  # fraction of pixels that differ
        return out
    return {'seg_logits': (a.seg_logits.data - b.seg_logits.data).abs().max().item(),
            'pred_sem_seg': (a.pred_sem_seg.data != b.pred_sem_seg.data).float().mean().item()}


PARITY = [COUNTERPARTS[0], COUNTERPARTS[3], COUNTERPARTS[6], COUNTERPARTS[11]]
PARITY_SLOW = [COUNTERPARTS[9], COUNTERPARTS[10]]
# Both sides run the same function in float32 (conftest: FP32_PARITY = 1.1e-4 relative on features). Boxes in
# pixels of a 160 px image: FP32_PARITY x 160 px = 1.7e-2 px would be the feature bound carried to box
# coordinates; the tighter 5e-3 px still covers Sparse R-CNN, whose six refinement stages grow the rounding
# to ~2e-3 px (the two-stage and one-stage models stay near 1e-4 px). Scores are sigmoid / softmax outputs in
# [0, 1] (derivative <= 1/4): FP32_PARITY / 4 rounded down to 1e-5. Segmentation logits (of order 1-10, absolute):
# FP32_PARITY x 1. Masks and label maps are thresholded / argmax outputs: a pixel whose two values lie within the
# rounding flips, so the bound is a fraction of pixels (1e-3), not equality.
_TOL = {'bboxes': 5e-3, 'scores': 1e-5, 'labels': 0.0, 'masks': 1e-3, 'seg_logits': 1e-4, 'pred_sem_seg': 1e-3}


def _parity(plugin, counterpart, published, tmp_path):
    from mmengine.runner import load_checkpoint
    pcfg, ccfg = _config(plugin, tmp_path, 'plugin'), _config(counterpart, tmp_path, 'counterpart')
    det = pcfg.get('default_scope', 'mmdet') == 'mmdet'
    # what the shrinking below must not hide: the test-time settings of the two configs are the same
    assert pcfg.test_dataloader.dataset.pipeline == ccfg.test_dataloader.dataset.pipeline
    assert pcfg.model.test_cfg == ccfg.model.test_cfg
    assert pcfg.model.data_preprocessor == ccfg.model.data_preprocessor
    pcfg, ccfg = _shrink(pcfg, det), _shrink(ccfg, det)
    theirs = randomize_(_build(ccfg), seed=1)
    img = _image(tmp_path)
    data_c, data_p = _run_pipeline(ccfg, img), _run_pipeline(pcfg, img)
    assert torch.equal(data_c['inputs'][0], data_p['inputs'][0])
    with torch.no_grad():
        ref = theirs.test_step(data_c)[0]
    counterpart_sd = theirs.state_dict()
    loaded = {}
    for layout, sd in {**_layouts(counterpart_sd, published)}.items():
        path = tmp_path / f'{layout}.pth'
        torch.save({'state_dict': sd, 'meta': {}}, path)
        ours = _build(pcfg)
        load_checkpoint(ours, str(path), map_location='cpu', strict=True)  # the load_from / test.py path
        loaded[layout] = ours.state_dict()
        # the counterpart's kernels: what is compared here is the loading (layouts, keys, conversion), and a
        # randomised Sparse R-CNN's six refinement stages turn the fused GEMM epilogues' 1e-7 rounding into tens of
        # pixels (the backbones' own parity across kernels: tests/models/backbones, FP32_PARITY)
        with torch.no_grad(), onednn_fusion_disabled():
            got = ours.test_step(copy.deepcopy(data_p))[0]
        diff = _differences(got, ref, det)
        print(f'PARITY {_name(plugin) if chr(10) not in plugin else "retinanet_swin-t drop-in"} <- {layout} '
              f'({_name(counterpart)}): ' + ', '.join(f'{k} {v:.2e}' for k, v in diff.items()))
        for k, v in diff.items():
            assert v <= _TOL[k], (layout, k, v)
    first = next(iter(loaded.values()))
    for sd in loaded.values():  # every layout loads the very same tensors
        assert all(torch.equal(first[k], sd[k]) for k in first)


@pytest.mark.parametrize('plugin,counterpart,kind,published', PARITY,
                         ids=['maskrcnn_mmdet', 'cascade_official', 'upernet_mmseg', 'retinanet_mmdet'])
def test_same_predictions_as_counterpart(plugin, counterpart, kind, published, tmp_path):
    _parity(plugin, counterpart, published, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize('plugin,counterpart,kind,published', PARITY_SLOW, ids=['atss', 'sparse_rcnn'])
def test_same_predictions_as_counterpart_slow(plugin, counterpart, kind, published, tmp_path):
    _parity(plugin, counterpart, published, tmp_path)


# ---------------------------------------------------------------------------------------------- refusals
def _small_pair(tmp_path):
    pcfg = _shrink(_config(COUNTERPARTS[0][0], tmp_path, 'plugin'), True)
    ccfg = _shrink(_config(COUNTERPARTS[0][1], tmp_path, 'counterpart'), True)
    return pcfg, ccfg


def test_a_file_that_still_does_not_fit_is_refused(tmp_path):
    pcfg, ccfg = _small_pair(tmp_path)
    ours = _build(pcfg)
    theirs = _build(ccfg)
    sd = theirs.state_dict()
    # another number of classes: the heads differ, the message names them and says what was converted
    bad = dict(sd, **{'roi_head.bbox_head.fc_cls.weight': torch.zeros(21, 1024)})
    msg = check_checkpoint_fits(ours, {'state_dict': bad}, source='x.pth', model_name='cfg.py')
    assert 'roi_head.bbox_head.fc_cls.weight (21, 1024) vs (81, 1024)' in msg
    assert 'from the OpenMMLab' in msg and 'backbone' in msg
    # another depth: missing / unexpected backbone blocks, after conversion
    ccfg2 = copy.deepcopy(ccfg)
    ccfg2.model.backbone.depths = [2, 2, 4, 2]
    msg = check_checkpoint_fits(ours, {'state_dict': _build(ccfg2).state_dict()})
    assert 'backbone.layers.2.blocks.2.' in msg and 'unexpected' in msg
    # another window: named with the fix, not resized silently
    ccfg3 = copy.deepcopy(ccfg)
    ccfg3.model.backbone.window_size = 12
    msg = check_checkpoint_fits(ours, {'state_dict': _build(ccfg3).state_dict()})
    assert 'window 12' in msg and 'window_size=12' in msg
    # a backbone-only file keeps its hint
    own = ours.state_dict()
    msg = check_checkpoint_fits(ours, {k[len('backbone.'):]: v for k, v in own.items() if k.startswith('backbone.')})
    assert 'backbone weights only' in msg
    # ... and so does one in a published backbone layout: mmdet's backbone, an official ImageNet classifier file
    mmdet_backbone = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    msg = check_checkpoint_fits(ours, mmdet_backbone)
    assert 'backbone weights only (OpenMMLab' in msg and 'No key matches' not in msg, msg
    official = {k[len('backbone.'):]: v for k, v in official_layout(sd).items() if k.startswith('backbone.')}
    classifier = {'model': {**official, 'norm.weight': torch.ones(256), 'head.weight': torch.zeros(10, 256)}}
    msg = check_checkpoint_fits(ours, classifier)
    assert 'backbone weights only (official Swin' in msg, msg
    # a file for another model entirely still says so
    msg = check_checkpoint_fits(ours, {'layer1.0.conv1.weight': torch.zeros(64, 64, 1, 1)})
    assert 'No key matches' in msg and 'backbone weights only' not in msg, msg


def test_swiftformer_detector_with_official_fork_feat_backbone_names(tmp_path):
    """A whole SwiftFormer detector whose backbone part has the official ``fork_feat`` names (``patch_embed``,
    ``network.i``, output BatchNorms ``norm0/2/4/6``): converted on load, strictly, and the backbone then computes
    what the official formulation computes with those weights."""
    from mmengine.runner import load_checkpoint
    cfg = _config(str(CONFIGS / 'demo/swiftformer_xs_maskrcnn_shapes.py'), tmp_path, 'plugin')
    ours = _build(cfg)
    arch = type(ours.backbone).arch_zoo['xs']
    ref = randomize_(ReferenceSwiftFormer(arch['depths'], arch['embed_dims']), seed=6).eval()
    sd = {**{k: v for k, v in ours.state_dict().items() if not k.startswith('backbone.')},
          **{'backbone.' + k: v for k, v in ref.state_dict().items()}}
    assert check_checkpoint_fits(ours, {'state_dict': sd}) is None
    assert 'official SwiftFormer' in convert_model_state_dict(ours, sd).describe()
    path = tmp_path / 'official_fork_feat_detector.pth'
    torch.save({'state_dict': sd, 'meta': {}}, path)
    load_checkpoint(ours, str(path), map_location='cpu', strict=True)
    ours.backbone.eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        for a, b in zip(ours.backbone(x), ref(x)):
            assert rel_err(a, b) < FP32_PARITY


def test_plugin_layout_passes_through_untouched(tmp_path):
    pcfg, _ = _small_pair(tmp_path)
    ours = randomize_(_build(pcfg))
    sd = ours.state_dict()
    conversion = convert_model_state_dict(ours, sd)
    assert not conversion.changed and conversion.describe() is None
    assert all(conversion.state_dict[k] is sd[k] for k in sd)


def test_load_from_logs_one_line_and_runner_loads(tmp_path, caplog):
    """``load_checkpoint`` (what ``load_from``, ``--resume`` and mmdet's ``init_detector`` call) converts and says
    so in one line."""
    from mmengine.logging import MMLogger
    from mmengine.runner import load_checkpoint
    pcfg, ccfg = _small_pair(tmp_path)
    theirs = randomize_(_build(ccfg), seed=2)
    path = tmp_path / 'mmdet.pth'
    torch.save({'state_dict': theirs.state_dict(), 'meta': {'epoch': 12}}, path)
    ours = _build(pcfg)
    logger = MMLogger.get_instance('published_test', log_level='INFO')
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    try:
        ckpt = load_checkpoint(ours, str(path), map_location='cpu', strict=True, logger='published_test')
    finally:
        logger.removeHandler(handler)
    assert ckpt['meta'] == {'epoch': 12}
    conv = [ln for ln in lines if ln.startswith('whole-model checkpoint: converted')]
    assert len(conv) == 1 and 'OpenMMLab' in conv[0] and 'derived buffers' in conv[0]
    w = theirs.state_dict()['backbone.stages.3.blocks.1.ffn.layers.1.weight']
    assert torch.equal(ours.state_dict()['backbone.layers.3.blocks.1.mlp.fc2.weight'], w)


def test_inferencer_imported_before_mmplugin_converts(tmp_path):
    """A user script imports mmdet's DetInferencer (and mmseg's inferencer) first and mmplugin arrives later through
    the config's custom_imports: their own references to mmengine's loader convert too (else it loads non-strictly and
    leaves the backbone random). In a fresh interpreter, since the import order is the point."""
    import os
    import subprocess
    import sys
    _, ccfg = _small_pair(tmp_path)
    theirs = randomize_(_build(ccfg), seed=5)
    ckpt = tmp_path / 'mmdet.pth'
    torch.save({'state_dict': theirs.state_dict(), 'meta': {}}, ckpt)
    child = _child_config(tmp_path, 'swin/swin_t_maskrcnn_1x_coco.py', True)
    script = textwrap.dedent(f"""
        import sys
        from mmdet.apis import DetInferencer
        from mmseg.apis import mmseg_inferencer
        assert 'mmplugin' not in sys.modules
        import torch
        inferencer = DetInferencer(model={str(child)!r}, weights={str(ckpt)!r}, device='cpu', show_progress=False)
        got = inferencer.model.state_dict()['backbone.layers.3.blocks.1.mlp.fc2.weight']
        sd = torch.load({str(ckpt)!r}, weights_only=True)['state_dict']
        want = sd['backbone.stages.3.blocks.1.ffn.layers.1.weight']
        assert torch.equal(got, want)
        assert mmseg_inferencer._load_checkpoint_to_model is sys.modules['mmengine.runner.checkpoint'].__dict__[
            '_load_checkpoint_to_model']  # MMSegInferencer's reference is the converting loader too
        print('converted and loaded')
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and 'converted and loaded' in out.stdout, out.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- tools
def _child_config(tmp_path: Path, base: str, det: bool) -> Path:
    """A plugin config shrunk as in the prediction tests, as a child config file (what a user would write)."""
    chans = [32, 64, 128, 256]
    small = dict(_delete_=True, **_SMALL)
    if det:
        extra = (f"model = dict(backbone=dict(arch={small!r}), neck=dict(in_channels={chans}), test_cfg=dict("
                 "rpn=dict(nms_pre=200, max_per_img=20), rcnn=dict(max_per_img=10, score_thr=0.0)))\n")
    else:
        extra = (f"model = dict(backbone=dict(arch={small!r}), decode_head=dict(in_channels={chans}), "
                 f"auxiliary_head=dict(in_channels={chans[2]}))\n")
    if det:
        pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(160, 128), keep_ratio=True),
                    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                                          'scale_factor'))]
    else:
        pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(256, 96), keep_ratio=True),
                    dict(type='PackSegInputs')]
    extra += f'test_pipeline = {pipeline!r}\ntest_dataloader = dict(dataset=dict(pipeline=test_pipeline))\n'
    path = tmp_path / f'child_{"det" if det else "seg"}.py'
    path.write_text(f'_base_ = [{str(CONFIGS / base)!r}]\n' + extra)
    return path


def test_convert_checkpoint_with_config_writes_a_strict_file(tmp_path, capsys):
    from mmplugin.cli import convert_checkpoint as tool
    pcfg, ccfg = _small_pair(tmp_path)
    theirs = randomize_(_build(ccfg), seed=3)
    src, dst = tmp_path / 'official.pth', tmp_path / 'plugin.pth'
    torch.save({'state_dict': official_layout(theirs.state_dict()), 'meta': {'CLASSES': ('a', )}}, src)
    child = _child_config(tmp_path, 'swin/swin_t_maskrcnn_1x_coco.py', True)
    assert tool.main([str(src), str(dst), '--config', str(child)]) == 0
    out = capsys.readouterr().out
    assert 'official Swin' in out and 'load strictly' in out
    written = torch.load(dst, weights_only=True)
    ours = _build(pcfg)
    ours.load_state_dict(written['state_dict'], strict=True)
    assert written['meta']['CLASSES'] == ('a', ) and 'official Swin' in written['meta']['conversion']
    # a file that does not fit is refused, nothing written
    torch.save({'state_dict': {'backbone.foo': torch.zeros(1)}}, src)
    assert tool.main([str(src), str(tmp_path / 'no.pth'), '--config', str(child)]) == 2
    assert 'does not fit' in capsys.readouterr().err and not (tmp_path / 'no.pth').exists()
    with pytest.raises(SystemExit):
        tool.main([str(src), str(dst), '--config', str(child), '--window-size', '12'])
    # the converted file is in the plugin's own layout: nothing left to convert
    assert not strict_model_state_dict(ours, written)[1].changed


def test_infer_tool_loads_published_layouts(tmp_path, capsys):
    """tools/infer.py (mmdet's init_detector and the mmseg path) takes mmdet- and mmseg-zoo files as they are."""
    from mmplugin.cli import infer as tool
    img = _image(tmp_path)
    for base, counterpart, det in (('swin/swin_t_maskrcnn_1x_coco.py', COUNTERPARTS[0][1], True),
                                   ('swin/swin_t_upernet_160k_ade20k.py', COUNTERPARTS[6][1], False)):
        ccfg = _shrink(_config(counterpart, tmp_path, 'counterpart'), det)
        ckpt = tmp_path / f'zoo_{det}.pth'
        torch.save({'state_dict': randomize_(_build(ccfg), seed=4).state_dict(), 'meta': {}}, ckpt)
        child = _child_config(tmp_path, base, det)
        rc = tool.main([str(child), str(ckpt), str(img), '--out', str(tmp_path / f'out_{det}.png')])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        assert (tmp_path / f'out_{det}.png').is_file()
