# Worked example (README "Using the backbones in your own config"): SwiftFormer-L1 in mmdet's RetinaNet 1x, COCO.
# Three outputs (strides 8/16/32) feed the FPN, which adds P6/P7 from its input; the stem and stage 1 are frozen.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']
custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
# The dataset's class names, set in every dataloader: mmdet keeps only the annotation file's categories of these
# names and drops the images left without any (tools/train.py stops when none match). For your own COCO-format
# dataset replace the names (and the dataloaders' data_root / ann_file); the head's num_classes follows them.
classes = ('person', 'bicycle', 'car', 'motorcycle', 'airplane', 'bus', 'train', 'truck', 'boat', 'traffic light',
           'fire hydrant', 'stop sign', 'parking meter', 'bench', 'bird', 'cat', 'dog', 'horse', 'sheep', 'cow',
           'elephant', 'bear', 'zebra', 'giraffe', 'backpack', 'umbrella', 'handbag', 'tie', 'suitcase', 'frisbee',
           'skis', 'snowboard', 'sports ball', 'kite', 'baseball bat', 'baseball glove', 'skateboard', 'surfboard',
           'tennis racket', 'bottle', 'wine glass', 'cup', 'fork', 'knife', 'spoon', 'bowl', 'banana', 'apple',
           'sandwich', 'orange', 'broccoli', 'carrot', 'hot dog', 'pizza', 'donut', 'cake', 'chair', 'couch',
           'potted plant', 'bed', 'dining table', 'toilet', 'tv', 'laptop', 'mouse', 'remote', 'keyboard',
           'cell phone', 'microwave', 'oven', 'toaster', 'sink', 'refrigerator', 'book', 'clock', 'vase', 'scissors',
           'teddy bear', 'hair drier', 'toothbrush')
metainfo = dict(classes=classes)
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmplugin.SwiftFormer',
        arch='l1',
        out_indices=(1, 2, 3),  # strides 8, 16, 32 -> channels [96, 192, 384]
        frozen_stages=1,  # stem and stage 1 fixed at their pretrained values
        norm_eval=True,  # BatchNorm statistics stay as pretrained
        init_cfg=dict(type='Pretrained', checkpoint='weights/SwiftFormer_L1.pth')),
    neck=dict(in_channels=[96, 192, 384], start_level=0, add_extra_convs='on_input', num_outs=5),
    bbox_head=dict(num_classes=len(classes)))
train_dataloader = dict(dataset=dict(metainfo=metainfo))
val_dataloader = dict(dataset=dict(metainfo=metainfo))
test_dataloader = val_dataloader
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
