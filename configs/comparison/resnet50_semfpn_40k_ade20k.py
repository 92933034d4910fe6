# SwiftFormer paper Table 3 row: ResNet-50 (mmdet / mmseg ResNet, torchvision ImageNet weights) + Semantic FPN 40k,
# ADE20K 512x512, under the SwiftFormer recipe (_base_/swiftformer_semfpn_40k.py: AdamW 2e-4, weight decay 1e-4,
# poly, batch 32). Paper: mIoU 36.7.
_base_ = ['mmplugin::_base_/swiftformer_semfpn_40k.py']
checkpoint = 'https://download.pytorch.org/models/resnet50-0676ba61.pth'  # torchvision IMAGENET1K_V1 (= torchvision://resnet50)
model = dict(
    backbone=dict(_delete_=True, type='mmseg.ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3),
                  norm_cfg=dict(type='SyncBN', requires_grad=True), norm_eval=False, style='pytorch',
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[256, 512, 1024, 2048]))
