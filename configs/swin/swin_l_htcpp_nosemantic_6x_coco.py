# Swin-L HTC++ 6x without the semantic branch, for users without the COCO-stuff stuffthingmaps: swin_l_htcpp_6x.py
# (Swin paper A2.2 / Table 2(c)) minus HTC's FusedSemanticHead, so 2.8M parameters below the paper's 284M and
# trained from COCO instances alone. Expect it to fall short of 57.1 / 49.5 by an unmeasured amount: the HTC paper's
# ablation (arXiv 1901.07518 §4) credits the semantic branch with part of HTC's gain.
_base_ = ['./swin_l_htcpp_6x_coco.py']
model = dict(roi_head=dict(semantic_roi_extractor=None, semantic_head=None))
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='InstaBoost', action_candidate=('normal', 'horizontal', 'skip'), action_prob=(1, 0, 0),
         scale=(0.8, 1.2), dx=15, dy=15, theta=(-1, 1), color_prob=0.5, hflag=False, aug_ratio=0.5),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=[(1600, 400), (1600, 1400)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(data_prefix=dict(_delete_=True, img='train2017/'), pipeline=train_pipeline))
