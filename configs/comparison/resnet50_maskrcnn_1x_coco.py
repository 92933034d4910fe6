# SwiftFormer paper Table 3 row: ResNet-50 (mmdet / mmseg ResNet, torchvision ImageNet weights) + Mask R-CNN 1x,
# COCO, under the SwiftFormer recipe (_base_/swiftformer_maskrcnn_1x.py: 1333x800, AdamW 2e-4, weight decay 1e-4,
# batch 32, 12 epochs). Paper: box AP 38.0, mask AP 34.4.
_base_ = ['mmplugin::_base_/swiftformer_maskrcnn_1x.py']
checkpoint = 'https://download.pytorch.org/models/resnet50-0676ba61.pth'  # torchvision IMAGENET1K_V1 (= torchvision://resnet50)
model = dict(
    backbone=dict(_delete_=True, type='mmdet.ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3), frozen_stages=1,
                  norm_cfg=dict(type='BN', requires_grad=True), norm_eval=True, style='pytorch',
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[256, 512, 1024, 2048]))
