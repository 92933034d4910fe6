# Demo: SwiftFormer-XS Semantic FPN trained from scratch on the synthetic ADE20K-layout shapes
# (tools/make_demo_data.py):
# 160 px images, 128-channel FPN, class-weighted cross-entropy + Dice, 1000 iterations, mIoU on the validation split.
_base_ = ['mmseg::_base_/models/fpn_r50.py', 'mmseg::_base_/default_runtime.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

data_root = 'data/demo/shapes_ade/'
metainfo = dict(classes=('background', 'circle', 'rectangle', 'triangle'),
                palette=[[0, 0, 0], [220, 20, 60], [0, 160, 0], [30, 60, 230]])
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=(160, 160)),
    pretrained=None,
    backbone=dict(_delete_=True, type='mmplugin.SwiftFormer', arch='xs', out_indices=(0, 1, 2, 3), init_cfg=None),
    neck=dict(in_channels=[48, 56, 112, 220], out_channels=128),
    decode_head=dict(
        in_channels=[128, 128, 128, 128], channels=64, num_classes=4, norm_cfg=norm_cfg,
        # background covers ~85 % of the pixels: down-weight it in the cross-entropy, and add a Dice term that
        # scores each class's overlap regardless of its area
        loss_decode=[dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0,
                          class_weight=[0.4, 1.0, 1.0, 1.0]),
                     dict(type='DiceLoss', loss_weight=0.5)]))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix='.png',
               seg_map_suffix='.png', reduce_zero_label=False)
train_dataloader = dict(
    batch_size=8, num_workers=1, persistent_workers=True, sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(**dataset, data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=1, persistent_workers=True, sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(**dataset, data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_iters = 1000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='PolyLR', power=0.9, eta_min=1e-5, by_epoch=False, begin=20, end=max_iters),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=100, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)

randomness = dict(seed=0)  # reproducible demo runs
