# Swin-T Cascade Mask R-CNN + FPN, 4conv1fc box heads with GIoU loss and SyncBN (official detection repository
# configs/swin/cascade_mask_rcnn_swin_*_giou_4conv1f_adamw_3x_coco.py), official detection recipe (3x).
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    './swin_det_recipe.py',
]
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)


def _box_head(stds):
    return dict(
        type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1, in_channels=256, conv_out_channels=256,
        fc_out_channels=1024, roi_feat_size=7, num_classes=80,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.], target_stds=stds),
        reg_class_agnostic=False, reg_decoded_bbox=True, norm_cfg=dict(type='SyncBN', requires_grad=True),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='GIoULoss', loss_weight=10.0))


model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwinTransformer',
        arch='tiny',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='weights/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]),
    # RoI features through mmplugin.RoIAlign: mmcv's RoIAlign function, multi-threaded CPU kernel (docs/benchmarks.md)
    roi_head=dict(
        bbox_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign')),
        mask_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign')),
        bbox_head=[
        _box_head([0.1, 0.1, 0.2, 0.2]),
        _box_head([0.05, 0.05, 0.1, 0.1]),
        _box_head([0.033, 0.033, 0.067, 0.067]),
    ]))
del _box_head
