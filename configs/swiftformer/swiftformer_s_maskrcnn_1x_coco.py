# SwiftFormer-S Mask R-CNN 1x, COCO. Source: SwiftFormer paper §4.4 / Table 3; recipe in
# _base_/swiftformer_maskrcnn_1x.py.
# Paper: box AP -, mask AP - (Table 3 reports L1 and L3 only).
_base_ = ['../_base_/swiftformer_maskrcnn_1x.py']
model = dict(
    backbone=dict(arch='s', init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_S.pth')),
    neck=dict(in_channels=[48, 64, 168, 224]))
