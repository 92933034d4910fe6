# SwiftFormer-L3 Mask R-CNN 1x, COCO. Source: SwiftFormer paper §4.4 / Table 3; recipe in
# _base_/swiftformer_maskrcnn_1x.py.
# Paper: box AP 42.7, mask AP 39.1 (Table 3 reports L1 and L3 only).
_base_ = ['../_base_/swiftformer_maskrcnn_1x.py']
model = dict(
    backbone=dict(arch='l3', init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_L3.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
