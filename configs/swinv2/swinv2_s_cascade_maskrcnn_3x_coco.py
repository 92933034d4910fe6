# Swin V2-S Cascade Mask R-CNN 3x, COCO, window 16, with the Swin V2 paper's ablation settings (A1.2; recipe in
# _base_/swinv2_cascade_maskrcnn.py). No official V2 detection config exists (microsoft/Swin-Transformer#240) and the
# paper reports no number for this exact setting. Weights: official swinv2_small_patch4_window16_256 (ImageNet-1K).
_base_ = ['../_base_/swinv2_cascade_maskrcnn.py']
model = dict(
    backbone=dict(arch='small',
                  init_cfg=dict(type='Pretrained', checkpoint='weights/swinv2_small_patch4_window16_256.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
