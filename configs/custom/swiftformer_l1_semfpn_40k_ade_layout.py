# Your own semantic-segmentation data in the ADE20K layout with the SwiftFormer-L1 Semantic FPN recipe
# (configs/swiftformer/swiftformer_l1_semfpn_40k_ade20k.py). Edit the block below; everything after it follows from it.
# docs/custom_data.md walks through each setting.
#
# Copy this file next to your data and edit the variables: they are read when the file is parsed, so
# `--cfg-options data_root=...` would not reach the dataloaders (override the final keys instead, e.g.
# `--cfg-options train_cfg.max_iters=4000`).
#
#   python tools/train.py configs/custom/swiftformer_l1_semfpn_40k_ade_layout.py
# the shipped recipe, found wherever this file lives
_base_ = ['mmplugin::swiftformer/swiftformer_l1_semfpn_40k_ade20k.py']

# ---------------------------------------------------------------- your data
data_root = 'data/my_ade/'          # images/{training,validation}/*.jpg|png, annotations/{training,validation}/*.png
img_suffix, seg_map_suffix = '.jpg', '.png'
classes = ('background', 'road', 'car')  # label value i in the PNGs is classes[i]; 255 is ignored
reduce_zero_label = False           # True when 0 means "unlabelled" in your PNGs (ADE20K's convention)
crop_size = (512, 512)              # training crops; test images are resized to scale, then to a multiple of 32
scale = (2048, 512)
max_iters = 40000
val_interval = 4000                 # validation and checkpoint every val_interval iterations
batch_size = 4                      # per GPU / process
# ----------------------------------------------------------------

metainfo = dict(classes=classes)
model = dict(data_preprocessor=dict(size=crop_size), decode_head=dict(num_classes=len(classes)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=reduce_zero_label),
    dict(type='RandomResize', scale=scale, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=scale, keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
    dict(type='LoadAnnotations', reduce_zero_label=reduce_zero_label),
    dict(type='PackSegInputs'),
]
dataset = dict(_delete_=True, type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix=img_suffix,
               seg_map_suffix=seg_map_suffix, reduce_zero_label=reduce_zero_label)
train_dataloader = dict(
    batch_size=batch_size,
    dataset=dict(**dataset, data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    dataset=dict(**dataset, data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
param_scheduler = [dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=max_iters, by_epoch=False)]
default_hooks = dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=val_interval, max_keep_ckpts=3))
