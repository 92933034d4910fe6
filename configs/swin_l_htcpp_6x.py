# Swin-L HTC++ 6x (72 epochs stepped at 63 and 69), COCO, ImageNet-22K initialisation. Source: Swin paper §4.2 system
# level / A2.2 (also quoted by the authors in microsoft/Swin-Transformer#113): HTC with InstaBoost, multi-scale training
# with short side 400-1400 (long side <= 1600), soft-NMS, drop path 0.2. Paper: 57.1 / 49.5 box / mask AP (minival,
# single scale); 58.0 / 50.4 minival and 58.7 / 51.1 test-dev with multi-scale testing (tools/test.py --tta).
# NOT REPRODUCIBLE AS PUBLISHED: the HTC++ config was never released (SwinTransformer/Swin-Transformer-Object-Detection
# #71, #2), the paper's "extra global self-attention layer appended at the output of the last stage" has no public
# definition and is NOT included here, and batch size / learning rate were never stated (batch 16 and the ablation
# AdamW lr 1e-4 are used). Whether HTC++ used the COCO-stuff semantic branch is unknown; this uses HTC without it.
# InstaBoost needs `pip install instaboostfast`.
_base_ = ['mmdet::htc/htc-without-semantic_r50_fpn_1x_coco.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformer',
        arch='large',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swin_large_patch4_window7_224_22k.pth')),
    neck=dict(in_channels=[192, 384, 768, 1536]),
    test_cfg=dict(rcnn=dict(nms=dict(type='soft_nms', iou_threshold=0.5))))
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='InstaBoost', action_candidate=('normal', 'horizontal', 'skip'), action_prob=(1, 0, 0),
         scale=(0.8, 1.2), dx=15, dy=15, theta=(-1, 1), color_prob=0.5, hflag=False, aug_ratio=0.5),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=[(1600, 400), (1600, 1400)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
# the Swin ablation optimizer  (same values as _base_/swin_det_recipe.py, restated because the mmdet
# base above already defines them and mmengine forbids duplicate keys among bases)
max_epochs = 72
train_dataloader = dict(batch_size=2, num_workers=2, dataset=dict(pipeline=train_pipeline))  # x 8 GPUs = 16
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[63, 69], gamma=0.1),
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
# multi-scale + flip test (tools/test.py --tta)
tta_model = dict(type='DetTTAModel',
                 tta_cfg=dict(nms=dict(type='soft_nms', iou_threshold=0.5), max_per_img=100))
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=s, keep_ratio=True) for s in [(1600, 1000), (1600, 1200), (1600, 1400)]],
        [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
        [dict(type='LoadAnnotations', with_bbox=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                                               'flip', 'flip_direction'))],
    ]),
]
