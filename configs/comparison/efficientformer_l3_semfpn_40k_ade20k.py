# SwiftFormer paper Table 3 row: EfficientFormer-L3 (mmplugin.EfficientFormer = the official
# efficientformer_l3_feat) + Semantic FPN 40k, ADE20K 512x512, under the SwiftFormer recipe
# (_base_/swiftformer_semfpn_40k.py: AdamW 2e-4, weight decay 1e-4, poly, batch 32). Paper: mIoU 43.5.
# resolution=16: the bias grid of the official segmentation backbone. mmpretrain's ImageNet file, converted from the
# official L3 (the file the official dense recipe started from, efficientformer_l3_300d.pth on Google Drive, loads
# here as well).
_base_ = ['mmplugin::_base_/swiftformer_semfpn_40k.py']
checkpoint = ('https://download.openmmlab.com/mmclassification/v0/efficientformer/'
              'efficientformer-l3_3rdparty_in1k_20220915-466793d6.pth')
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.EfficientFormer', arch='l3', resolution=16, drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))
