# SwiftFormer paper Table 3 row: ResNet-18 (mmdet / mmseg ResNet, torchvision ImageNet weights) + Semantic FPN 40k,
# ADE20K 512x512, under the SwiftFormer recipe (_base_/swiftformer_semfpn_40k.py: AdamW 2e-4, weight decay 1e-4,
# poly, batch 32). Paper: mIoU 32.9.
_base_ = ['mmplugin::_base_/swiftformer_semfpn_40k.py']
checkpoint = 'https://download.pytorch.org/models/resnet18-f37072fd.pth'  # torchvision IMAGENET1K_V1 (= torchvision://resnet18)
model = dict(
    backbone=dict(_delete_=True, type='mmseg.ResNet', depth=18, num_stages=4, out_indices=(0, 1, 2, 3),
                  norm_cfg=dict(type='SyncBN', requires_grad=True), norm_eval=False, style='pytorch',
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 256, 512]))
