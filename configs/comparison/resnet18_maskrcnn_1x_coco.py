# SwiftFormer paper Table 3 row: ResNet-18 (mmdet / mmseg ResNet, torchvision ImageNet weights) + Mask R-CNN 1x,
# COCO, under the SwiftFormer recipe (_base_/swiftformer_maskrcnn_1x.py: 1333x800, AdamW 2e-4, weight decay 1e-4,
# batch 32, 12 epochs). Paper: box AP 34.0, mask AP 31.2.
_base_ = ['mmplugin::_base_/swiftformer_maskrcnn_1x.py']
checkpoint = 'https://download.pytorch.org/models/resnet18-f37072fd.pth'  # torchvision IMAGENET1K_V1 (= torchvision://resnet18)
model = dict(
    backbone=dict(_delete_=True, type='mmdet.ResNet', depth=18, num_stages=4, out_indices=(0, 1, 2, 3), frozen_stages=1,
                  norm_cfg=dict(type='BN', requires_grad=True), norm_eval=True, style='pytorch',
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 256, 512]))
