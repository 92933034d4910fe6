# Swin V2 UperNet 160k on ADE20K with the V2 paper's ablation settings (A1.2): 512x512 crops, window 16, AdamW 4e-5,
# weight decay 0.05, linear decay, linear warm-up 1500 iterations, batch 16, 160k iterations, drop path 0.3,
# layer-wise lr decay 0.95 (mmplugin.LayerDecayOptimWrapperConstructor).
_base_ = ['./swin_upernet_160k.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformerV2',
        arch='tiny',
        window_size=16,
        pretrained_window_size=16,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swinv2_tiny_patch4_window16_256.pth')))
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
