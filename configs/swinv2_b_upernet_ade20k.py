# Swin V2-B UperNet 160k, ADE20K 512x512, window 16. Source: Swin V2 paper A1.2 (ablation settings: AdamW 4e-5,
# weight decay 0.05, linear decay, linear warm-up 1500 iterations, batch 16, 160k iterations, drop path 0.3, layer-wise
# lr decay 0.95). No official V2 segmentation config exists; the paper reports no number for this exact setting.
_base_ = ['./_base_/swin_upernet_160k.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformerV2',
        arch='base',
        window_size=16,
        pretrained_window_size=16,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swinv2_base_patch4_window16_256.pth')),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='mmplugin.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=4e-5, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        layer_decay_rate=0.95,
        custom_keys={
            'cpb_mlp': dict(decay_mult=0.),
            'logit_scale': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.),
        }))
