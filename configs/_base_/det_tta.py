# Multi-scale + flip test-time augmentation for mmdet detectors with boxes and instance masks (tools/test.py --tta).
# Add it to a detector config's bases: _base_ = [..., 'mmplugin::_base_/det_tta.py'] (or './_base_/det_tta.py' here).
# mmplugin.MaskDetTTAModel merges the views as mmdet's DetTTAModel does (un-flip, class-wise NMS, max_per_img)
# and keeps each kept detection's mask (mmdet's DetTTAModel refuses instance masks; docs/evaluation.md).
# Scales: three shorter sides around mmdet's single-scale 1333 x 800 test (640 / 800 / 960), each with and without
# a horizontal flip; a config trained at other sizes restates tta_pipeline with its own scales
# (configs/_base_/swin_htcpp.py does, for the Swin paper's HTC++). No custom_imports here (mmengine refuses the
# same key in two bases): the config that adds this piece imports mmplugin, as every plugin config does.
tta_model = dict(type='mmplugin.MaskDetTTAModel',
                 tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=s, keep_ratio=True) for s in [(1333, 640), (1333, 800), (1333, 960)]],
        # the flip before any padding, so that boxes and masks flip back about the original image's centre
        [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
        [dict(type='LoadAnnotations', with_bbox=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                                               'flip', 'flip_direction'))],
    ]),
]
