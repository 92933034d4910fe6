# SwiftFormer + Semantic FPN, ADE20K, 512x512 crops, 40k iterations (SwiftFormer paper §4.5: batch 32, AdamW lr 2e-4,
# poly schedule). Unstated values follow EfficientFormer
# segmentation/configs/sem_fpn/fpn_efficientformer_l1_ade20k_40k.py
# @d01da42: weight decay 1e-4, poly power 0.9 to 0, no warm-up, no AMP; test images resized up to a multiple of 32
# (EfficientFormer's AlignResize == mmseg's ResizeToMultiple).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_40k.py',
]
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,  # the base sets a ResNet URL that EncoderDecoder would push into the backbone
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwiftFormer',
        arch='l1',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_L1.pth')),
    neck=dict(in_channels=[48, 96, 192, 384], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=4, num_workers=4)  # x 8 GPUs = 32 (paper)
val_dataloader = dict(batch_size=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    clip_grad=None)
param_scheduler = [dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=40000, by_epoch=False)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=40000, val_interval=4000)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=4000))
