# Swin-S Mask R-CNN 3x (36 epochs, multi-scale + crop, AdamW, AMP), COCO. Source: Swin paper §4.2 / Table 2;
# official detection repo configs/swin/mask_rcnn_swin_small_patch4_window7_mstrain_480-800_adamw_3x_coco.py.
# Paper / official README box / mask AP: 48.5 / 43.3
_base_ = ['../_base_/swin_maskrcnn.py']
model = dict(
    backbone=dict(arch='small', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swin_small_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
