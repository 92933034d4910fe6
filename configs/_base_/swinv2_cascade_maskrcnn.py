# Swin V2 Cascade Mask R-CNN 3x with the V2 paper's ablation settings (A1.2: Cascade Mask R-CNN, multi-scale 480-800
# x 1333, window 16, AdamW 1e-4, weight decay 0.05, batch 16, 3x); the V1 detection recipe otherwise. No decay on
# the continuous position bias MLP, logit scales and norms (the official V2 no-weight-decay list).
_base_ = ['./swin_cascade_maskrcnn.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformerV2',
        arch='tiny',
        window_size=16,
        pretrained_window_size=16,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swinv2_tiny_patch4_window16_256.pth')))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'cpb_mlp': dict(decay_mult=0.),
    'logit_scale': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.),
}))
