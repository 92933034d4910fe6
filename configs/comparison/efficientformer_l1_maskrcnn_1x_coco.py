# SwiftFormer paper Table 3 row: EfficientFormer-L1 (mmplugin.EfficientFormer = the official
# efficientformer_l1_feat) + Mask R-CNN 1x, COCO, under the SwiftFormer recipe (_base_/swiftformer_maskrcnn_1x.py:
# 1333x800, AdamW 2e-4, weight decay 1e-4, batch 32, 12 epochs). Paper: box AP 37.9, mask AP 35.4. resolution=25:
# the bias grid of the official detection backbone (16 in its segmentation one). mmpretrain's ImageNet file,
# converted from the official 1000-epoch L1; the official dense recipe started from the 300-epoch
# efficientformer_l1_300d.pth (Google Drive only), which loads here as well
# (checkpoint='weights/efficientformer_l1_300d.pth').
_base_ = ['mmplugin::_base_/swiftformer_maskrcnn_1x.py']
checkpoint = ('https://download.openmmlab.com/mmclassification/v0/efficientformer/'
              'efficientformer-l1_3rdparty_in1k_20220915-cc3e1ac6.pth')
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.EfficientFormer', arch='l1', resolution=25, drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[48, 96, 224, 448]))
