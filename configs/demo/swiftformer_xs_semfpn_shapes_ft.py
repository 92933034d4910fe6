# Demo (what tools/demo.sh trains): the Semantic FPN of swiftformer_xs_semfpn_shapes.py with its SwiftFormer-XS
# initialised from the demo detector's backbone (trained from scratch by the detector step on the COCO-format shapes,
# another sample of the same generator; the ADE-layout validation images are unseen by both), as real configs start
# from ImageNet weights. Narrower FPN (64 channels) and head (32), 500 iterations: about 4.5 min on 2 CPU cores.
# From scratch, the same head needs 1000+ iterations for mIoU 79 (swiftformer_xs_semfpn_shapes.py, README).
# tools/demo.sh passes the detector checkpoint: --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = ['./swiftformer_xs_semfpn_shapes.py']
model = dict(
    backbone=dict(init_cfg=dict(_delete_=True, type='Pretrained', prefix='backbone.',
                                checkpoint='work_dirs/demo/det/iter_800.pth')),
    neck=dict(out_channels=64),
    decode_head=dict(in_channels=[64, 64, 64, 64], channels=32))

max_iters = 500
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='PolyLR', power=0.9, eta_min=1e-5, by_epoch=False, begin=20, end=max_iters),
]
