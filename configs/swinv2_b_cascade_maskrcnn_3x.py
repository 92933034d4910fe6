# Swin V2-B Cascade Mask R-CNN 3x, COCO, window 16. Source: Swin V2 paper A1.2 (ablation settings: Cascade Mask R-CNN,
# multi-scale 480-800 x 1333, window 16, AdamW 1e-4, weight decay 0.05, batch 16, 3x). No official V2 detection config
# exists (microsoft/Swin-Transformer#240); the paper reports no number for this exact setting. Weights: the official
# swinv2_base_patch4_window16_256 ImageNet-1K release (pretrained window 16).
_base_ = ['./_base_/swin_cascade_maskrcnn.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformerV2',
        arch='base',
        window_size=16,
        pretrained_window_size=16,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swinv2_base_patch4_window16_256.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'cpb_mlp': dict(decay_mult=0.),
    'logit_scale': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.),
}))
