# The demo's A/B, third row: the demo detector recipe (configs/demo/swiftformer_xs_maskrcnn_shapes.py, nothing else
# changed) with EfficientFormer-L1 (from scratch; the official efficientformer_l1_feat backbone, SwiftFormer paper
# Table 3's comparison row) in place of SwiftFormer-XS: the same stride-8/16/32 outputs into the same FPN and heads.
# tools/demo.sh does not run it:
#   python tools/train.py configs/demo/efficientformer_l1_maskrcnn_shapes.py --work-dir work_dirs/demo_ef_l1
_base_ = ['./swiftformer_xs_maskrcnn_shapes.py']
model = dict(
    backbone=dict(_delete_=True, type='mmplugin.EfficientFormer', arch='l1', out_indices=(0, 1, 2, 3),
                  drop_path_rate=0.0, init_cfg=None),
    neck=dict(in_channels=[48, 96, 224, 448]))
