# SwiftFormer paper Table 3 row: EfficientFormer-L1 (mmplugin.EfficientFormer = the official
# efficientformer_l1_feat) + Semantic FPN 40k, ADE20K 512x512, under the SwiftFormer recipe
# (_base_/swiftformer_semfpn_40k.py: AdamW 2e-4, weight decay 1e-4, poly, batch 32). Paper: mIoU 38.9.
# resolution=16: the bias grid of the official segmentation backbone. mmpretrain's ImageNet file, converted from the
# official 1000-epoch L1; the official dense recipe started from the 300-epoch efficientformer_l1_300d.pth (Google
# Drive only), which loads here as well (checkpoint='weights/efficientformer_l1_300d.pth').
_base_ = ['mmplugin::_base_/swiftformer_semfpn_40k.py']
checkpoint = ('https://download.openmmlab.com/mmclassification/v0/efficientformer/'
              'efficientformer-l1_3rdparty_in1k_20220915-cc3e1ac6.pth')
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.EfficientFormer', arch='l1', resolution=16, drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[48, 96, 224, 448]))
