"""Post-training static int8 and its measurement.

* :mod:`.pt2e`: PT2E quantisation for XNNPACK, ExecuTorch ``.pte`` lowering and its runner; what stays float
  (:data:`~.pt2e.KEEP_FLOAT_PRESETS`, :func:`~.pt2e.default_keep_float` per backend);
* :mod:`.ort`: static QDQ int8 for onnxruntime from the fp32 ONNX export;
* :mod:`.evaluate`: calibration images from the training split, int8 parts installed in an mmdet / mmseg model,
  the task metric before and after, and eager-against-int8 timings (``tools/quantize.py``).

Each module imports its runtime (``executorch``, ``torchao``, ``onnxruntime``) on use.
"""
