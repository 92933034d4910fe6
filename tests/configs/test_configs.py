"""Every config loads, builds its full model, trains one step and infers once on the CPU; schedule values
match one table of expected values with their sources; neck / head channels match the backbone."""
from __future__ import annotations

import functools
import re

import pytest
import torch
from conftest import CONFIGS, _build, _check_channels, _det_batch, _fewer_rois, _seg_batch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper

FAMILY_DIRS = ('swin', 'swinv2', 'swiftformer')  # the paper configs; configs/comparison/ has its own tests
ALL = sorted(p.relative_to(CONFIGS).as_posix() for d in FAMILY_DIRS for p in (CONFIGS / d).glob('*.py')) + [
    'custom/swiftformer_l1_retinanet_1x_coco.py']
# the former flat paths (configs/<name>.py) still load: each is a stub inheriting its new file
MOVED = sorted(p.name for p in CONFIGS.glob('*.py')) + [
    'custom/swiftformer_l1_maskrcnn_coco_format.py', 'custom/swiftformer_l1_semfpn_ade_layout.py']

P_SF, EF = 'SwiftFormer paper §4.4/§4.5', 'EfficientFormer recipe (snap-research/EfficientFormer @d01da42)'
SOD, SSS = 'official Swin detection repo @c7b2011', 'official Swin segmentation repo @87e6f90'
P_SW, P_V2 = 'Swin paper §4.2/A2.2', 'Swin V2 paper A1.2'

# (config glob, dotted path, expected value, source)
SCHEDULE = [
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'optim_wrapper.optimizer.type', 'AdamW', P_SF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'optim_wrapper.optimizer.lr', 2e-4, P_SF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'optim_wrapper.optimizer.weight_decay', 1e-4, EF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'train_cfg.max_epochs', 12, P_SF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'param_scheduler.1.milestones', [8, 11], EF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'param_scheduler.0.end', 500, EF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'param_scheduler.0.start_factor', 1e-6, EF),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'train_dataloader.batch_size', 4, P_SF + ' (32 = 8 x 4)'),
    ('swiftformer/swiftformer_*_maskrcnn_1x_coco.py', 'model.backbone.drop_path_rate', 0.0, EF),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'optim_wrapper.optimizer.lr', 2e-4, P_SF),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'optim_wrapper.optimizer.weight_decay', 1e-4, EF),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'param_scheduler.0.type', 'PolyLR', P_SF),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'param_scheduler.0.power', 0.9, EF),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'train_cfg.max_iters', 40000, P_SF),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'train_dataloader.batch_size', 4, P_SF + ' (32 = 8 x 4)'),
    ('swiftformer/swiftformer_*_semfpn_40k_ade20k.py', 'crop_size', (512, 512), P_SF),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'optim_wrapper.optimizer.lr', 1e-4, SOD),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'optim_wrapper.optimizer.weight_decay', 0.05, SOD),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'optim_wrapper.type', 'AmpOptimWrapper', SOD + ' (apex O1)'),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'train_cfg.max_epochs', 36, SOD),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'param_scheduler.1.milestones', [27, 33], SOD),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'train_dataloader.batch_size', 2, SOD + ' (16 = 8 x 2)'),
    ('swin/swin_*_maskrcnn_3x_coco.py',
     'optim_wrapper.paramwise_cfg.custom_keys.relative_position_bias_table.decay_mult', 0.,
     SOD),
    ('swin/swin_*_maskrcnn_3x_coco.py', 'optim_wrapper.paramwise_cfg.custom_keys.norm.decay_mult', 0., SOD),
    ('swin/swin_*_maskrcnn_1x_coco.py', 'train_cfg.max_epochs', 12, SOD),
    ('swin/swin_*_maskrcnn_1x_coco.py', 'param_scheduler.1.milestones', [8, 11], SOD),
    ('swin/swin_t_maskrcnn_1x_coco.py', 'model.backbone.drop_path_rate', 0.1, SOD),
    ('swin/swin_t_maskrcnn_3x_coco.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin/swin_s_maskrcnn_3x_coco.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin/swin_t_cascade_maskrcnn_3x_coco.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin/swin_s_cascade_maskrcnn_3x_coco.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin/swin_b_cascade_maskrcnn_3x_coco.py', 'model.backbone.drop_path_rate', 0.3, SOD),
    ('swin/swin_*_cascade_maskrcnn_3x_coco.py', 'model.roi_head.bbox_head.0.loss_bbox.type', 'GIoULoss', SOD),
    ('swin/swin_*_cascade_maskrcnn_3x_coco.py', 'model.roi_head.bbox_head.2.num_shared_convs', 4, SOD),
    ('swin/swin_*_cascade_maskrcnn_3x_coco.py', 'train_cfg.max_epochs', 36, SOD),
    ('swin/swin_t_atss_3x_coco.py', 'train_cfg.max_epochs', 36, P_SW),
    ('swin/swin_t_sparse_rcnn_3x_coco.py', 'optim_wrapper.optimizer.lr', 1e-4, P_SW),
    ('swin/swin_*_htcpp*_6x_coco.py', 'train_cfg.max_epochs', 72, P_SW),
    ('swin/swin_*_htcpp*_6x_coco.py', 'param_scheduler.1.milestones', [63, 69], P_SW),
    ('swin/swin_*_htcpp*_6x_coco.py', 'model.test_cfg.rcnn.nms.type', 'soft_nms', P_SW),
    ('swin/swin_*_htcpp*_6x_coco.py', 'model.backbone.drop_path_rate', 0.2, P_SW),
    ('swin/swin_*_upernet_160k_ade20k.py', 'optim_wrapper.optimizer.lr', 6e-5, SSS),
    ('swin/swin_*_upernet_160k_ade20k.py', 'optim_wrapper.optimizer.weight_decay', 0.01, SSS),
    ('swin/swin_*_upernet_160k_ade20k.py', 'param_scheduler.0.end', 1500, SSS),
    ('swin/swin_*_upernet_160k_ade20k.py', 'param_scheduler.1.power', 1.0, SSS),
    ('swin/swin_*_upernet_160k_ade20k.py', 'train_cfg.max_iters', 160000, SSS),
    ('swin/swin_*_upernet_160k_ade20k.py', 'train_dataloader.batch_size', 2, SSS + ' (16 = 8 x 2)'),
    ('swin/swin_*_upernet_160k_ade20k.py', 'model.backbone.drop_path_rate', 0.3, SSS),
    ('swin/swin_*_upernet_160k_ade20k.py', 'model.auxiliary_head.loss_decode.loss_weight', 0.4, SSS),
    ('swin/swin_*_htcpp_6x_coco.py', 'model.roi_head.semantic_head.num_classes', 183,
     'HTC / mmdet htc_r50_fpn_1x_coco.py'),
    ('swin/swin_*_htcpp*_6x_coco.py', 'model.roi_head.bbox_head.2.num_shared_convs', 4, 'Swin paper Table 2(c) counts'),
    ('swinv2/swinv2_*_cascade_maskrcnn_3x_coco.py', 'model.backbone.window_size', 16, P_V2),
    ('swinv2/swinv2_*_cascade_maskrcnn_3x_coco.py', 'optim_wrapper.optimizer.lr', 1e-4, P_V2),
    ('swinv2/swinv2_*_cascade_maskrcnn_3x_coco.py', 'train_cfg.max_epochs', 36, P_V2),
    ('swinv2/swinv2_*_upernet_160k_ade20k.py', 'optim_wrapper.optimizer.lr', 4e-5, P_V2),
    ('swinv2/swinv2_*_upernet_160k_ade20k.py', 'optim_wrapper.optimizer.weight_decay', 0.05, P_V2),
    ('swinv2/swinv2_*_upernet_160k_ade20k.py', 'optim_wrapper.paramwise_cfg.layer_decay_rate', 0.95, P_V2),
    ('swinv2/swinv2_*_upernet_160k_ade20k.py', 'model.backbone.window_size', 16, P_V2),
    ('swinv2/swinv2_*_upernet_160k_ade20k.py', 'model.backbone.drop_path_rate', 0.3, P_V2),
    ('swinv2/swinv2_*_upernet_160k_ade20k.py', 'train_cfg.max_iters', 160000, P_V2),
]


@functools.lru_cache(maxsize=None)
def _load(name: str) -> Config:
    return Config.fromfile(str(CONFIGS / name))


def _get(cfg, path):
    cur = cfg
    for part in path.split('.'):
        cur = cur[int(part)] if part.isdigit() else cur[part]
    return cur


@pytest.mark.parametrize('pattern,path,expected,source', SCHEDULE, ids=[f'{p}:{k}' for p, k, _, _ in SCHEDULE])
def test_schedule_values(pattern, path, expected, source):
    files = sorted(CONFIGS.glob(pattern))
    assert files, pattern
    for f in files:
        name = f.relative_to(CONFIGS).as_posix()
        value = _get(_load(name), path)
        if isinstance(expected, float):
            assert value == pytest.approx(expected), f'{name}: {path} = {value}, expected {expected} ({source})'
        else:
            assert (list(value) if isinstance(value, (list, tuple)) else value) == (
                list(expected) if isinstance(expected, (list, tuple)) else expected), \
                f'{name}: {path} = {value}, expected {expected} ({source})'


def test_required_files_exist():
    for arch in ('xs', 's', 'l1', 'l3'):
        assert f'swiftformer/swiftformer_{arch}_maskrcnn_1x_coco.py' in ALL
        assert f'swiftformer/swiftformer_{arch}_semfpn_40k_ade20k.py' in ALL
    for v in 'tsb':
        for kind in ('maskrcnn_1x_coco', 'maskrcnn_3x_coco', 'cascade_maskrcnn_3x_coco', 'upernet_160k_ade20k'):
            assert f'swin/swin_{v}_{kind}.py' in ALL
        for kind in ('cascade_maskrcnn_3x_coco', 'upernet_160k_ade20k'):
            assert f'swinv2/swinv2_{v}_{kind}.py' in ALL
    for name in ('swin/swin_t_atss_3x_coco.py', 'swin/swin_t_sparse_rcnn_3x_coco.py', 'swin/swin_l_htcpp_6x_coco.py',
                 'swin/swin_b_htcpp_6x_coco.py', 'swin/swin_l_htcpp_nosemantic_6x_coco.py'):
        assert name in ALL
    for f in ALL:  # every file names its source in a leading comment
        assert (CONFIGS / f).read_text().startswith('#'), f


@pytest.mark.parametrize('name', MOVED)
def test_former_paths_load_their_new_file(name):
    """configs/<old name>.py is a two-line stub whose one base is the moved file; both load to the same config."""
    text = (CONFIGS / name).read_text()
    base = re.fullmatch(r"# Former path of (\S+); kept so that existing commands keep loading\.\n"
                        r"_base_ = \['\./(\S+)'\]\n", text)
    assert base and ((CONFIGS / name).parent / base.group(2)).resolve() == (CONFIGS / base.group(1)).resolve(), text
    assert (CONFIGS / base.group(1)).is_file() and 'Former path' not in _load(base.group(1)).text
    old, new = Config.fromfile(str(CONFIGS / name)), _load(base.group(1))
    assert old.to_dict() == new.to_dict()


# test_htcpp.py builds both HTC++ configs once and trains them a step: not twice (Swin-L HTC++ is 284M parameters)
STEPPED_ELSEWHERE = {'swin/swin_l_htcpp_6x_coco.py', 'swin/swin_b_htcpp_6x_coco.py'}


# the quick tier (tools/run_tests.sh --quick) steps one config of each family and task; the rest are 'heavy'
QUICK = {'swin/swin_t_maskrcnn_1x_coco.py', 'swiftformer/swiftformer_xs_maskrcnn_1x_coco.py',
         'swin/swin_t_upernet_160k_ade20k.py', 'swinv2/swinv2_t_upernet_160k_ade20k.py',
         'swiftformer/swiftformer_xs_semfpn_40k_ade20k.py'}


@pytest.mark.parametrize('name', [n if n in QUICK else pytest.param(n, marks=pytest.mark.heavy)
                                  for n in ALL if n not in STEPPED_ELSEWHERE])
def test_config_builds_trains_and_infers(name):
    cfg = _load(name).copy()
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'  # official weights by default ...
    cfg.model.backbone.init_cfg = None  # ... which tests cannot download
    _fewer_rois(cfg)
    model = revert_sync_batchnorm(_build(cfg))
    model.init_weights()
    _check_channels(cfg, model)
    # shrink the input, not the config
    if cfg.get('default_scope', 'mmdet') == 'mmseg':
        model.data_preprocessor.size = (64, 64)
        data = _seg_batch()
    else:
        data = _det_batch(model)
    optim_cfg = cfg.optim_wrapper.copy()
    if optim_cfg.get('type') == 'AmpOptimWrapper' and not torch.cuda.is_available():
        optim_cfg['type'] = 'OptimWrapper'  # mmengine's AMP wrapper needs an accelerator (tools/train.py does the same)
    optim = build_optim_wrapper(model, optim_cfg)
    model.eval()
    with torch.no_grad():
        results = model.test_step(data)
    assert len(results) == 2
    model.train()
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad][:50]
    losses = model.train_step(data, optim)
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total), losses
    after = [p for p in model.parameters() if p.requires_grad][:50]
    assert any(not torch.equal(a, b) for a, b in zip(after, before)), 'the training step changed nothing'


def test_layer_decay_constructor_scales_lr():
    cfg = Config.fromfile(str(CONFIGS / 'swinv2/swinv2_t_upernet_160k_ade20k.py'))
    model = revert_sync_batchnorm(_build(cfg))
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    groups = optim.optimizer.param_groups
    names = [n for n, _ in model.named_parameters()]
    assert len(groups) == len(names)
    # Swin V2-T depths [2, 2, 6, 2]: depth 0 patch embedding, blocks 1..12, everything after the backbone 13
    # (V2 paper A1.2: lr * 0.95 ** (13 - depth)); merges and output norms share their stage's last block's depth.
    want = {'backbone.patch_embed.proj.weight': 13, 'backbone.layers.0.blocks.0.attn.qkv.weight': 12,
            'backbone.layers.0.blocks.1.mlp.fc1.weight': 11, 'backbone.layers.0.downsample.reduction.weight': 11,
            'backbone.norm0.weight': 11, 'backbone.layers.2.blocks.5.attn.proj.weight': 3,
            'backbone.layers.3.blocks.1.mlp.fc2.weight': 1, 'backbone.norm3.weight': 1,
            'decode_head.conv_seg.weight': 0}
    lr = dict(zip(names, (g['lr'] for g in groups)))
    for n, power in want.items():
        assert lr[n] == pytest.approx(4e-5 * 0.95**power), n
    by_name = dict(zip(names, groups))
    assert by_name['backbone.layers.0.blocks.0.norm1.weight']['weight_decay'] == 0.0
    assert by_name['backbone.layers.0.blocks.0.mlp.fc1.weight']['weight_decay'] == pytest.approx(0.05)
