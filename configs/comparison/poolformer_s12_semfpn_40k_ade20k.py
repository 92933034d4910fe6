# SwiftFormer paper Table 3 row: PoolFormer-S12 (mmplugin.PoolFormer = the official fork_feat backbone) + Semantic
# FPN 40k, ADE20K 512x512, under the SwiftFormer recipe (_base_/swiftformer_semfpn_40k.py: AdamW 2e-4, weight decay
# 1e-4, poly, batch 32). Paper: mIoU 37.2.
_base_ = ['mmplugin::_base_/swiftformer_semfpn_40k.py']
# official ImageNet-1K weights
checkpoint = 'https://github.com/sail-sg/poolformer/releases/download/v1.0/poolformer_s12.pth.tar'
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.PoolFormer', arch='s12', drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))
