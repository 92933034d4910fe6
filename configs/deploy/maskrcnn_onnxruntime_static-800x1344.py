# As maskrcnn_onnxruntime_dynamic.py, for one fixed input size (H x W = 800 x 1344, batch 1): anchors and the image
# size are constants in the graph. Other sizes are refused by onnxruntime. Change input_shape (W, H) as needed.
_base_ = ['./maskrcnn_onnxruntime_dynamic.py']
onnx_config = dict(input_shape=[1344, 800], dynamic_axes=None)
