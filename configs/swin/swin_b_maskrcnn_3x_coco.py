# Swin-B Mask R-CNN 3x (36 epochs, multi-scale + crop, AdamW, AMP), COCO. Source: Swin paper §4.2 / Table 2;
# official detection repo configs/swin/mask_rcnn_swin_base_patch4_window7_mstrain_480-800_adamw_3x_coco.py.
# Paper / official README box / mask AP: - (no official Mask R-CNN B config; Cascade B is 51.9 / 45.0)
_base_ = ['../_base_/swin_maskrcnn.py']
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3,
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swin_base_patch4_window7_224.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))
