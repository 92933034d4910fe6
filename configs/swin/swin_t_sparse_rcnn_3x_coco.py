# Swin-T Sparse R-CNN 3x (300 proposals), COCO. Source: Swin paper §4.2 / Table 2a (47.9 box AP vs R-50 44.5); no
# official config exists. mmdet's Sparse R-CNN 3x already trains with the DETR-style multi-scale crop; the optimizer is
# the paper's (AdamW 1e-4, weight decay 0.05, batch 16, no decay on bias tables / norms), keeping Sparse R-CNN's
# gradient clipping (max norm 1).
_base_ = ['mmdet::sparse_rcnn/sparse-rcnn_r50_fpn_300-proposals_crop-ms-480-800-3x_coco.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformer',
        arch='tiny',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=1, norm_type=2),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }))
