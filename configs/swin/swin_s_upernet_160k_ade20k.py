# Swin-S UperNet 160k, ADE20K 512x512. Source: Swin paper §4.3 / A2.3; official segmentation repo
# configs/swin/upernet_swin_small_patch4_window7_512x512_160k_ade20k.py. Official mIoU single-scale / multi-scale+flip:
# 47.64 / 49.47 (multi-scale + flip: tools/test.py --tta).
_base_ = ['../_base_/swin_upernet_160k.py']
model = dict(
    backbone=dict(arch='small',
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swin_small_patch4_window7_224.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
