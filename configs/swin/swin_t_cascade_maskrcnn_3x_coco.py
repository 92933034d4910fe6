# Swin-T Cascade Mask R-CNN 3x, 4conv1fc GIoU heads, COCO. Source: Swin paper §4.2 / Table 2; official detection
# repo configs/swin/cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py.
# Official box / mask AP: 50.4 / 43.7 (paper Table 2: 50.5 / 43.7)
_base_ = ['../_base_/swin_cascade_maskrcnn.py']
model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
