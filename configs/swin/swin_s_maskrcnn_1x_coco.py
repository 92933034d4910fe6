# Swin-S Mask R-CNN 1x (12 epochs stepped at 8 and 11; multi-scale + crop, AdamW, AMP), COCO. Source: official
# detection repo configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py (drop path 0.1 for T;
# S/B have no official 1x config and keep their 3x drop path). Official box / mask AP: - (no official 1x config)
_base_ = ['../_base_/swin_maskrcnn.py']
model = dict(
    backbone=dict(arch='small', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swin_small_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
