# SwiftFormer-S Semantic FPN 40k, ADE20K 512x512. Source: SwiftFormer paper §4.5 / Table 3; recipe in
# _base_/swiftformer_semfpn_40k.py. Paper: mIoU - (Table 3 reports L1 and L3 only).
_base_ = ['../_base_/swiftformer_semfpn_40k.py']
model = dict(
    backbone=dict(arch='s', init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_S.pth')),
    neck=dict(in_channels=[48, 64, 168, 224]))
