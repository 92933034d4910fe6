# Swin-T Mask R-CNN 3x (36 epochs, multi-scale + crop, AdamW, AMP), COCO. Source: Swin paper §4.2 / Table 2;
# official detection repo configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_3x_coco.py.
# Paper / official README box / mask AP: 46.0 / 41.6
_base_ = ['../_base_/swin_maskrcnn.py']
model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
