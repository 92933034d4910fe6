# The README's A/B: the demo detector recipe (configs/demo/swiftformer_xs_maskrcnn_shapes.py, nothing else changed)
# with mmdet's ResNet-18 (BN, from scratch) in place of SwiftFormer-XS: the same stride-8/16/32 outputs into the same
# FPN and heads. tools/demo.sh does not run it:
#   python tools/train.py configs/demo/r18_maskrcnn_shapes.py --work-dir work_dirs/demo_r18
_base_ = ['./swiftformer_xs_maskrcnn_shapes.py']
model = dict(
    backbone=dict(_delete_=True, type='mmdet.ResNet', depth=18, num_stages=4, out_indices=(0, 1, 2, 3),
                  frozen_stages=-1, norm_cfg=dict(type='BN', requires_grad=True), norm_eval=False, style='pytorch',
                  init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
