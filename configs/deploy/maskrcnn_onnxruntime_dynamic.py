# mmdeploy 1.3.1 deploy config: two-stage instance segmentation (Mask R-CNN, Cascade Mask R-CNN) to onnxruntime,
# dynamic batch / height / width. Use through tools/export_mmdeploy.py (applies mmplugin.export.mmdeploy).
# Opset 16: RoiAlign with coordinate_transformation_mode='half_pixel' (mmcv's aligned=True); below 16 mmdeploy
# emits the opset-10 RoiAlign, which onnxruntime clamps to >= 1 feature pixel per side, unlike mmcv.
# Graph input: the image after the model's data preprocessor (normalised, RGB, float32, (B, 3, H, W)).
# Outputs: dets (B, K, 5) x1 y1 x2 y2 score, labels (B, K), masks (B, K, 28, 28) probabilities of each detection's
# class (pasted into the image in Python; rows with score 0 are padding).
onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    opset_version=16,
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['dets', 'labels', 'masks'],
    input_shape=None,
    optimize=False,  # mmdeploy's graph optimizer needs its compiled TorchScript extension
    dynamic_axes=dict(
        input={0: 'batch', 2: 'height', 3: 'width'},
        dets={0: 'batch', 1: 'num_dets'},
        labels={0: 'batch', 1: 'num_dets'},
        masks={0: 'batch', 1: 'num_dets'}))
codebase_config = dict(
    type='mmdet',
    task='ObjectDetection',
    model_type='end2end',
    # with mmplugin.export.mmdeploy's heads the model's test_cfg decides (rpn: nms_pre, nms, max_per_img,
    # min_bbox_size; rcnn: score_thr, nms, max_per_img, mask_thr_binary); these apply to mmdeploy's own heads only
    post_processing=dict(
        score_threshold=0.05,
        confidence_threshold=0.005,
        iou_threshold=0.5,
        max_output_boxes_per_class=200,
        pre_top_k=5000,
        keep_top_k=100,
        background_label_id=-1,
        export_postprocess_mask=False))
backend_config = dict(type='onnxruntime')
