"""Export: the models as graphs other runtimes execute, with parity checks against eager PyTorch.

* :mod:`.exportable`: the exported parts (:class:`ExportPart`: ``backbone``, ``backbone+neck``, ``model``) and
  the rewrites that keep sizes symbolic in a captured graph (:func:`make_exportable`);
* :mod:`.onnx`: :func:`export_onnx` (torch.export-based, dynamic batch / height / width), :func:`onnx_session`,
  :func:`onnx_parity`;
* :mod:`.backends`: one export-and-run interface over ONNX / onnxruntime, OpenVINO, ExecuTorch (XNNPACK), LiteRT
  and Core ML; the runtime-specific steps in :mod:`.executorch`, :mod:`.litert`, :mod:`.coreml` and the graph
  rewrites they share in :mod:`.rewrites`;
* :mod:`.mmdeploy`: mmdeploy 1.3.1 on torch >= 2.9 with mmdet's post-processing in the graph (imported on use).

int8 lives in :mod:`mmplugin.quantization`, measuring exported models in :mod:`mmplugin.analysis`, reduced
precision and ``torch.compile`` in :mod:`mmplugin.inference`.
"""
from __future__ import annotations

from mmplugin.export.exportable import PARTS, ExportPart, adaptive_pool_matrix, flatten_outputs, make_exportable
from mmplugin.export.onnx import DEFAULT_OPSET, example_input, export_onnx, onnx_parity, onnx_session

__all__ = ['PARTS', 'DEFAULT_OPSET', 'ExportPart', 'adaptive_pool_matrix', 'flatten_outputs', 'make_exportable',
           'example_input', 'export_onnx', 'onnx_session', 'onnx_parity']
