# Swin-T Mask R-CNN + FPN with the official detection recipe (3x); variants override arch, drop path, weights, FPN.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './swin_det_recipe.py',
]
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformer',
        arch='tiny',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint='weights/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]),
    # RoI features through mmplugin.RoIAlign: mmcv's RoIAlign function, multi-threaded CPU kernel (docs/benchmarks.md)
    roi_head=dict(
        bbox_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign')),
        mask_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign'))))
