# Swin V2-B UperNet 160k, ADE20K 512x512, window 16, with the Swin V2 paper's ablation settings (A1.2; recipe in
# _base_/swinv2_upernet_160k.py). No official V2 segmentation config exists; the paper reports no number for this
# exact setting. Weights: official swinv2_base_patch4_window16_256 (ImageNet-1K).
_base_ = ['../_base_/swinv2_upernet_160k.py']
model = dict(
    backbone=dict(arch='base',
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swinv2_base_patch4_window16_256.pth')),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
