# The Swin detection recipe of the official detection repository (SwinTransformer/Swin-Transformer-Object-Detection
# @c7b2011, configs/swin/*_mstrain_480-800_adamw_3x_coco.py; Swin paper §4.2 / A2.2), in mmdet 3.x form:
# multi-scale training with short side 480-800 (long side 1333) and the DETR-style crop branch, AdamW lr 1e-4,
# weight decay 0.05 with no decay on relative_position_bias_table / absolute_pos_embed / norms, batch 16 (8 x 2),
# 36 epochs stepped at 27 and 33, linear warm-up 500 iterations from 0.001, mixed precision (apex O1 there,
# AmpOptimWrapper here). The Swin Mask R-CNN and Cascade configs add their model; configs whose mmdet base already
# carries a dataset and schedule (ATSS, HTC) restate these values instead (mmengine forbids duplicate keys among bases).
_base_ = [
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
ms_scales = [(480, 1333), (512, 1333), (544, 1333), (576, 1333), (608, 1333), (640, 1333), (672, 1333), (704, 1333),
             (736, 1333), (768, 1333), (800, 1333)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[
        [dict(type='RandomChoiceResize', scales=ms_scales, keep_ratio=True)],
        [dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)], keep_ratio=True),
         dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600), allow_negative_crop=True),
         dict(type='RandomChoiceResize', scales=ms_scales, keep_ratio=True)],
    ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=2, dataset=dict(pipeline=train_pipeline))  # x 8 GPUs = 16

max_epochs = 36
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }))
auto_scale_lr = dict(enable=False, base_batch_size=16)
