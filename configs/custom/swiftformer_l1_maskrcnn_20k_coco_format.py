# Your own COCO-format instance data with the SwiftFormer-L1 Mask R-CNN recipe
# (configs/swiftformer/swiftformer_l1_maskrcnn_1x_coco.py).
# Edit the block below; everything after it follows from it. docs/custom_data.md walks through each setting.
#
# Copy this file next to your data and edit the variables: they are read when the file is parsed, so
# `--cfg-options data_root=...` would not reach the dataloaders (override the final keys instead, e.g.
# `--cfg-options train_cfg.max_iters=4000`).
#
#   python tools/train.py
# configs/custom/swiftformer_l1_maskrcnn_20k_coco_format.py
# the shipped recipe, found wherever this file lives
_base_ = ['mmplugin::swiftformer/swiftformer_l1_maskrcnn_1x_coco.py']

# ---------------------------------------------------------------- your data
data_root = 'data/my_coco/'                     # folder holding the annotation files and the image folders
train_ann, train_images = 'annotations/instances_train.json', 'train/'
val_ann, val_images = 'annotations/instances_val.json', 'val/'
classes = ('circle', 'rectangle', 'triangle')   # category names as in the json; others there are left out
input_scale = (1333, 800)                       # longer x shorter side the images are resized to (keep ratio)
max_iters = 20000                               # iteration-based schedule: length in iterations,
val_interval = 2000                             # validation and checkpoint every val_interval iterations
batch_size = 4                                  # per GPU / process
# ----------------------------------------------------------------

metainfo = dict(classes=classes)
num_classes = len(classes)
model = dict(roi_head=dict(bbox_head=dict(num_classes=num_classes), mask_head=dict(num_classes=num_classes)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=input_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=input_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=batch_size,
    sampler=dict(_delete_=True, type='InfiniteSampler', shuffle=True),   # iterations, not epochs
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file=train_ann, data_prefix=dict(img=train_images),
                 pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file=val_ann, data_prefix=dict(img=val_images),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + val_ann)
test_evaluator = val_evaluator

train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
param_scheduler = [   # the recipe's warm-up and steps at 8/12 and 11/12 of the run, in iterations
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=max(1, min(500, max_iters // 10))),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters,
         milestones=[max_iters * 8 // 12, max_iters * 11 // 12], gamma=0.1),
]
default_hooks = dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=val_interval, max_keep_ckpts=3))
log_processor = dict(by_epoch=False)
