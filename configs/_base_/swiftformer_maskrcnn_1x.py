# SwiftFormer + Mask R-CNN + FPN, COCO 2017, 12 epochs (SwiftFormer paper §4.4: 1333x800, batch 32, AdamW lr 2e-4).
# Values the paper leaves open follow the EfficientFormer recipe it cites (snap-research/EfficientFormer
# detection/configs/mask_rcnn_efficientformer_l1_fpn_1x_coco.py @d01da42): weight decay 1e-4, no paramwise_cfg,
# steps at epochs 8 and 11, linear warm-up 500 iterations from 1e-6, drop path 0, no AMP, no gradient clipping.
# Each variant sets model.backbone.arch, the official ImageNet checkpoint and the FPN in_channels of its arch.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwiftFormer',
        arch='l1',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,
        norm_cfg=dict(type='BN'),  # dict(type='SyncBN') for multi-GPU runs with small per-GPU batches
        init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_L1.pth')),
    neck=dict(in_channels=[48, 96, 192, 384], out_channels=256, num_outs=5),
    # RoI features through mmplugin.RoIAlign: mmcv's RoIAlign function, multi-threaded CPU kernel (docs/benchmarks.md)
    roi_head=dict(
        bbox_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign')),
        mask_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign'))))

# paper: total batch 32 (8 GPUs x 4). The EfficientFormer code trained with 8 x 2 = 16 at the same lr.
train_dataloader = dict(batch_size=4, num_workers=4)

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    clip_grad=None)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
auto_scale_lr = dict(enable=False, base_batch_size=32)
