# SwiftFormer paper Table 3 row: EfficientFormer-L3 (mmplugin.EfficientFormer = the official
# efficientformer_l3_feat) + Mask R-CNN 1x, COCO, under the SwiftFormer recipe (_base_/swiftformer_maskrcnn_1x.py:
# 1333x800, AdamW 2e-4, weight decay 1e-4, batch 32, 12 epochs). Paper: box AP 41.4, mask AP 38.1. resolution=25:
# the bias grid of the official detection backbone (16 in its segmentation one). mmpretrain's ImageNet file,
# converted from the official L3 (the file the official dense recipe started from, efficientformer_l3_300d.pth on
# Google Drive, loads here as well).
_base_ = ['mmplugin::_base_/swiftformer_maskrcnn_1x.py']
checkpoint = ('https://download.openmmlab.com/mmclassification/v0/efficientformer/'
              'efficientformer-l3_3rdparty_in1k_20220915-466793d6.pth')
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.EfficientFormer', arch='l3', resolution=25, drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))
