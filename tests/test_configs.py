"""Every config loads, builds its full model, trains one step and infers once on the CPU; schedule values
match one table of expected values with their sources; neck / head channels match the backbone."""
from __future__ import annotations

import functools


from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper

CONFIGS = Path(__file__).resolve().parents[1] / 'configs'
ALL = sorted(p.name for p in CONFIGS.glob('*.py'))

P_SF, EF = 'SwiftFormer paper §4.4/§4.5', 'EfficientFormer recipe (snap-research/EfficientFormer @d01da42)'
SOD, SSS = 'official Swin detection repo @c7b2011', 'official Swin segmentation repo @87e6f90'
P_SW, P_V2 = 'Swin paper §4.2/A2.2', 'Swin V2 paper A1.2'

# (config glob, dotted path, expected value, source)
SCHEDULE = [
    ('swiftformer_*_maskrcnn.py', 'optim_wrapper.optimizer.type', 'AdamW', P_SF),
    ('swiftformer_*_maskrcnn.py', 'optim_wrapper.optimizer.lr', 2e-4, P_SF),
    ('swiftformer_*_maskrcnn.py', 'optim_wrapper.optimizer.weight_decay', 1e-4, EF),
    ('swiftformer_*_maskrcnn.py', 'train_cfg.max_epochs', 12, P_SF),
    ('swiftformer_*_maskrcnn.py', 'param_scheduler.1.milestones', [8, 11], EF),
    ('swiftformer_*_maskrcnn.py', 'param_scheduler.0.end', 500, EF),
    ('swiftformer_*_maskrcnn.py', 'param_scheduler.0.start_factor', 1e-6, EF),
    ('swiftformer_*_maskrcnn.py', 'train_dataloader.batch_size', 4, P_SF + ' (32 = 8 x 4)'),
    ('swiftformer_*_maskrcnn.py', 'model.backbone.drop_path_rate', 0.0, EF),
    ('swiftformer_*_semfpn_ade20k.py', 'optim_wrapper.optimizer.lr', 2e-4, P_SF),
    ('swiftformer_*_semfpn_ade20k.py', 'optim_wrapper.optimizer.weight_decay', 1e-4, EF),
    ('swiftformer_*_semfpn_ade20k.py', 'param_scheduler.0.type', 'PolyLR', P_SF),
    ('swiftformer_*_semfpn_ade20k.py', 'param_scheduler.0.power', 0.9, EF),
    ('swiftformer_*_semfpn_ade20k.py', 'train_cfg.max_iters', 40000, P_SF),
    ('swiftformer_*_semfpn_ade20k.py', 'train_dataloader.batch_size', 4, P_SF + ' (32 = 8 x 4)'),
    ('swiftformer_*_semfpn_ade20k.py', 'crop_size', (512, 512), P_SF),
    ('swin_*_maskrcnn_3x.py', 'optim_wrapper.optimizer.lr', 1e-4, SOD),
    ('swin_*_maskrcnn_3x.py', 'optim_wrapper.optimizer.weight_decay', 0.05, SOD),
    ('swin_*_maskrcnn_3x.py', 'optim_wrapper.type', 'AmpOptimWrapper', SOD + ' (apex O1)'),
    ('swin_*_maskrcnn_3x.py', 'train_cfg.max_epochs', 36, SOD),
    ('swin_*_maskrcnn_3x.py', 'param_scheduler.1.milestones', [27, 33], SOD),
    ('swin_*_maskrcnn_3x.py', 'train_dataloader.batch_size', 2, SOD + ' (16 = 8 x 2)'),
    ('swin_*_maskrcnn_3x.py', 'optim_wrapper.paramwise_cfg.custom_keys.relative_position_bias_table.decay_mult', 0.,
     SOD),
    ('swin_*_maskrcnn_3x.py', 'optim_wrapper.paramwise_cfg.custom_keys.norm.decay_mult', 0., SOD),
    ('swin_*_maskrcnn_1x.py', 'train_cfg.max_epochs', 12, SOD),
    ('swin_*_maskrcnn_1x.py', 'param_scheduler.1.milestones', [8, 11], SOD),
    ('swin_t_maskrcnn_1x.py', 'model.backbone.drop_path_rate', 0.1, SOD),
    ('swin_t_maskrcnn_3x.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin_s_maskrcnn_3x.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin_t_cascade_maskrcnn_3x.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin_s_cascade_maskrcnn_3x.py', 'model.backbone.drop_path_rate', 0.2, SOD),
    ('swin_b_cascade_maskrcnn_3x.py', 'model.backbone.drop_path_rate', 0.3, SOD),
    ('swin_*_cascade_maskrcnn_3x.py', 'model.roi_head.bbox_head.0.loss_bbox.type', 'GIoULoss', SOD),
    ('swin_*_cascade_maskrcnn_3x.py', 'model.roi_head.bbox_head.2.num_shared_convs', 4, SOD),
    ('swin_*_cascade_maskrcnn_3x.py', 'train_cfg.max_epochs', 36, SOD),
    ('swin_t_atss_3x.py', 'train_cfg.max_epochs', 36, P_SW),
    ('swin_t_sparse_rcnn_3x.py', 'optim_wrapper.optimizer.lr', 1e-4, P_SW),
    ('swin_*_htcpp*_6x.py', 'train_cfg.max_epochs', 72, P_SW),
    ('swin_*_htcpp*_6x.py', 'param_scheduler.1.milestones', [63, 69], P_SW),
    ('swin_*_htcpp*_6x.py', 'model.test_cfg.rcnn.nms.type', 'soft_nms', P_SW),
    ('swin_*_htcpp*_6x.py', 'model.backbone.drop_path_rate', 0.2, P_SW),
    ('swin_*_upernet_ade20k.py', 'optim_wrapper.optimizer.lr', 6e-5, SSS),
    ('swin_*_upernet_ade20k.py', 'optim_wrapper.optimizer.weight_decay', 0.01, SSS),
    ('swin_*_upernet_ade20k.py', 'param_scheduler.0.end', 1500, SSS),
    ('swin_*_upernet_ade20k.py', 'param_scheduler.1.power', 1.0, SSS),
    ('swin_*_upernet_ade20k.py', 'train_cfg.max_iters', 160000, SSS),
    ('swin_*_upernet_ade20k.py', 'train_dataloader.batch_size', 2, SSS + ' (16 = 8 x 2)'),
    ('swin_*_upernet_ade20k.py', 'model.backbone.drop_path_rate', 0.3, SSS),
    ('swin_*_upernet_ade20k.py', 'model.auxiliary_head.loss_decode.loss_weight', 0.4, SSS),
    ('swin_*_htcpp_6x.py', 'model.roi_head.semantic_head.num_classes', 183, 'HTC / mmdet htc_r50_fpn_1x_coco.py'),
    ('swin_*_htcpp*_6x.py', 'model.roi_head.bbox_head.2.num_shared_convs', 4, 'Swin paper Table 2(c) counts'),
    ('swinv2_*_cascade_maskrcnn_3x.py', 'model.backbone.window_size', 16, P_V2),
    ('swinv2_*_cascade_maskrcnn_3x.py', 'optim_wrapper.optimizer.lr', 1e-4, P_V2),
    ('swinv2_*_cascade_maskrcnn_3x.py', 'train_cfg.max_epochs', 36, P_V2),
    ('swinv2_*_upernet_ade20k.py', 'optim_wrapper.optimizer.lr', 4e-5, P_V2),
    ('swinv2_*_upernet_ade20k.py', 'optim_wrapper.optimizer.weight_decay', 0.05, P_V2),
    ('swinv2_*_upernet_ade20k.py', 'optim_wrapper.paramwise_cfg.layer_decay_rate', 0.95, P_V2),
    ('swinv2_*_upernet_ade20k.py', 'model.backbone.window_size', 16, P_V2),
    ('swinv2_*_upernet_ade20k.py', 'model.backbone.drop_path_rate', 0.3, P_V2),
    ('swinv2_*_upernet_ade20k.py', 'train_cfg.max_iters', 160000, P_V2),
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
        value = _get(_load(f.name), path)
        if isinstance(expected, float):
            assert value == pytest.approx(expected), f'{f.name}: {path} = {value}, expected {expected} ({source})'
        else:
            assert (list(value) if isinstance(value, (list, tuple)) else value) == (
                list(expected) if isinstance(expected, (list, tuple)) else expected), \
                f'{f.name}: {path} = {value}, expected {expected} ({source})'


def test_required_files_exist():
    for arch in ('xs', 's', 'l1', 'l3'):
        assert f'swiftformer_{arch}_maskrcnn.py' in ALL and f'swiftformer_{arch}_semfpn_ade20k.py' in ALL
    for v in 'tsb':
        for kind in ('maskrcnn_1x', 'maskrcnn_3x', 'cascade_maskrcnn_3x', 'upernet_ade20k'):
            assert f'swin_{v}_{kind}.py' in ALL
        for kind in ('cascade_maskrcnn_3x', 'upernet_ade20k'):
            assert f'swinv2_{v}_{kind}.py' in ALL
    for name in ('swin_t_atss_3x.py', 'swin_t_sparse_rcnn_3x.py', 'swin_l_htcpp_6x.py', 'swin_b_htcpp_6x.py',
                 'swin_l_htcpp_nosemantic_6x.py'):
        assert name in ALL
    for f in ALL:  # every file names its source in a leading comment
        assert (CONFIGS / f).read_text().startswith('#'), f


def _build(cfg):
    if cfg.get('default_scope', 'mmdet') == 'mmseg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    return MODELS.build(cfg.model)


def _det_batch(model, size=96):
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    from mmdet.structures.mask import BitmapMasks
    samples = []
    for i in range(2):
        s = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size),
                                        scale_factor=(1., 1.), batch_input_shape=(size, size), img_id=i))
        gt = InstanceData()
        gt.bboxes = torch.tensor([[10., 12., 60., 70.], [30., 5., 90., 40.]])
        gt.labels = torch.tensor([1, 3])
        masks = torch.zeros(2, size, size, dtype=torch.uint8)
        masks[0, 12:70, 10:60] = 1
        masks[1, 5:40, 30:90] = 1
        gt.masks = BitmapMasks(masks.numpy(), size, size)
        s.gt_instances = gt
        if getattr(getattr(model, 'roi_head', None), 'with_semantic', False):  # HTC's COCO-stuff branch
            from mmengine.structures import PixelData
            s.gt_sem_seg = PixelData(sem_seg=torch.randint(0, 183, (1, size, size)))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8) for _ in range(2)],
                data_samples=samples)


def _seg_batch(size=64):
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, size, size)))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8) for _ in range(2)],
                data_samples=samples)


def _check_channels(cfg, model):
    out = list(model.backbone.out_channels)
    if 'neck' in cfg.model and 'in_channels' in cfg.model.neck:
        assert list(cfg.model.neck.in_channels) == out
    if cfg.model.get('decode_head') and cfg.model.get('neck') is None:
        assert list(cfg.model.decode_head.in_channels) == out
    aux = cfg.model.get('auxiliary_head')
    if aux and cfg.model.get('neck') is None:
        idx = aux.get('in_index', 2)
        assert aux.in_channels == out[idx]


# test_htcpp.py builds both HTC++ configs once and trains them a step: not twice (Swin-L HTC++ is 284M parameters)
STEPPED_ELSEWHERE = {'swin_l_htcpp_6x.py', 'swin_b_htcpp_6x.py'}


# the quick tier (tools/run_tests.sh --quick) steps one config of each family and task; the rest are 'heavy'
QUICK = {'swin_t_maskrcnn_1x.py', 'swiftformer_xs_maskrcnn.py',
         'swin_t_upernet_ade20k.py', 'swinv2_t_upernet_ade20k.py', 'swiftformer_xs_semfpn_ade20k.py'}


@pytest.mark.parametrize('name', [n if n in QUICK else pytest.param(n, marks=pytest.mark.heavy)
                                  for n in ALL if n not in STEPPED_ELSEWHERE])
def test_config_builds_trains_and_infers(name):
    cfg = _load(name).copy()
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'  # official weights by default ...
    cfg.model.backbone.init_cfg = None  # ... which tests cannot download
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
    cfg = Config.fromfile(str(CONFIGS / 'swinv2_t_upernet_ade20k.py'))
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
