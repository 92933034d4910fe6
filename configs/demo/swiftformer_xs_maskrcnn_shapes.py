# Demo: SwiftFormer-XS Mask R-CNN trained from scratch on the synthetic COCO-format shapes (tools/make_demo_data.py),
# sized for 2 CPU cores: 192 px images, 128-channel FPN and heads with 1024-wide box FCs (mmdet's default 256 channels
# cost 3.9 s per iteration here instead of 1.4 s, see the README), 300 proposals, 64 sampled RoIs per image (1-3
# objects per image), RoIAlign sampling_ratio 1 (RoIAlign dominates CPU training time), AdamW with warm-up and cosine
# decay over 800 iterations (the schedule is what held the 400-iteration demo back).
# The ResNet-18 A/B of the README: configs/demo/r18_maskrcnn_shapes.py (this recipe, mmdet's ResNet-18).
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::_base_/default_runtime.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

data_root = 'data/demo/shapes_coco/'
metainfo = dict(classes=('circle', 'rectangle', 'triangle'), palette=[(220, 20, 60), (0, 160, 0), (30, 60, 230)])
roi_layer = dict(type='RoIAlign', output_size=7, sampling_ratio=1)
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.SwiftFormer', arch='xs', out_indices=(0, 1, 2, 3), init_cfg=None),
    neck=dict(in_channels=[48, 56, 112, 220], out_channels=128),
    rpn_head=dict(in_channels=128, feat_channels=128),
    roi_head=dict(
        bbox_roi_extractor=dict(roi_layer=roi_layer, out_channels=128),
        mask_roi_extractor=dict(roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=1), out_channels=128),
        bbox_head=dict(num_classes=3, in_channels=128, fc_out_channels=1024),
        mask_head=dict(num_classes=3, in_channels=128, conv_out_channels=128)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=64))),
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
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.5e-3, weight_decay=0.05),
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
