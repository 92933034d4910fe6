# Worked example (README "Writing your own config"): SwiftFormer-L1 in mmdet's RetinaNet 1x, COCO.
# Three outputs (strides 8/16/32) feed the FPN, which adds P6/P7 from its input; the stem and stage 1 are frozen.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwiftFormer',
        arch='l1',
        out_indices=(1, 2, 3),  # strides 8, 16, 32 -> channels [96, 192, 384]
        frozen_stages=1,  # stem and stage 1 fixed at their pretrained values
        norm_eval=True,  # BatchNorm statistics stay as pretrained
        init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_L1.pth')),
    neck=dict(in_channels=[96, 192, 384], start_level=0, add_extra_convs='on_input', num_outs=5))
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
