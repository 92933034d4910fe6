# Demo: SwiftFormer-XS Mask R-CNN trained from scratch on the synthetic COCO-format shapes (tools/make_demo_data.py),
# sized to train and evaluate within 10 minutes on 2 CPU cores; each choice was measured (README, Quick start):
# - the shapes are 31-81 px (less where occluded) in 192 px images, so the FPN starts at stride 8: of the backbone's
#   4-level pyramid it reads strides 8/16/32 -> P3-P6, anchors 32-256 px. The stride-4 level's 128-channel 3x3
#   convolutions were a third of each iteration.
# - 128-channel FPN and heads (mmdet's 256 channels: 3x the time per iteration), 1024-wide box FCs and 128-channel
#   mask convolutions: 512-wide FCs / 64-channel mask convolutions lost 0.08-0.09 AP50 at the same schedule.
# - the mask head reads the box head's 7x7 RoI features (no second RoIAlign; 14x14 mask targets): 800 iterations in
#   473 s instead of 716 s (with fused AdamW), bbox AP 0.764 instead of 0.760.
# - 64 sampled RoIs per image (1-3 objects), 200 training proposals, RoIAlign sampling_ratio 1; fused AdamW (the same
#   update to 2e-7, 7x faster than the per-tensor loop), 50 warm-up iterations, cosine decay over 800 iterations.
# The ResNet-18 A/B of the README: configs/demo/r18_maskrcnn_shapes.py (this recipe, mmdet's ResNet-18).
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::_base_/default_runtime.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

data_root = 'data/demo/shapes_coco/'
metainfo = dict(classes=('circle', 'rectangle', 'triangle'), palette=[(220, 20, 60), (0, 160, 0), (30, 60, 230)])
roi_layer = dict(type='RoIAlign', output_size=7, sampling_ratio=1)
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.SwiftFormer', arch='xs', out_indices=(0, 1, 2, 3), init_cfg=None),
    # start_level=1: the stride-4 map is left out (its output norm stays in the checkpoint for the segmentor)
    neck=dict(in_channels=[48, 56, 112, 220], out_channels=128, start_level=1, num_outs=4),
    rpn_head=dict(in_channels=128, feat_channels=128,
                  anchor_generator=dict(scales=[4], ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32, 64])),
    roi_head=dict(
        bbox_roi_extractor=dict(roi_layer=roi_layer, out_channels=128, featmap_strides=[8, 16, 32]),
        mask_roi_extractor=None,  # None: the mask head shares the box head's 7x7 RoI features
        bbox_head=dict(num_classes=3, in_channels=128, fc_out_channels=1024),
        mask_head=dict(num_classes=3, in_channels=128, conv_out_channels=128, num_convs=2, roi_feat_size=7)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(sampler=dict(num=64), mask_size=14)),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300), rcnn=dict(max_per_img=30)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(192, 192), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(192, 192), keep_ratio=True),  # records scale_factor (a no-op at 192 px)
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(type='CocoDataset', data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=4), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True, drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CocoDataset', data_root=data_root, metainfo=metainfo, test_mode=True,
                 ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='CocoMetric', ann_file=data_root + 'annotations/instances_val.json',
                     metric=['bbox', 'segm'])
test_evaluator = val_evaluator

max_iters = 800
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.5e-3, weight_decay=0.05, fused=True),
                     clip_grad=dict(max_norm=10, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', T_max=max_iters - 50, eta_min=2e-5, by_epoch=False, begin=50, end=max_iters),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=100, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=4)

randomness = dict(seed=0)  # reproducible demo runs
