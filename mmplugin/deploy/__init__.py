"""Deployment: dynamic-shape ONNX export with onnxruntime parity checks, and mmdeploy end-to-end export.

* :mod:`.exportable`: the exported parts (:class:`ExportPart`: ``backbone``, ``backbone+neck``, ``model``) and
  the rewrites that keep sizes symbolic in a captured graph (:func:`make_exportable`);
* :mod:`.onnx`: :func:`export_onnx` (torch.export-based, dynamic batch / height / width), :func:`onnx_session`,
  :func:`onnx_parity`;
* :mod:`.mmdeploy`: mmdeploy 1.3.1 on torch >= 2.9 and mmdet's post-processing in the graph (imported on use:
  ``from mmplugin.deploy.mmdeploy import export_end2end``).

Reduced-precision inference and ``torch.compile`` are not deployment: they live in :mod:`mmplugin.inference.fast`
and are re-exported here so existing imports keep working. :func:`max_rel_error` is
:func:`mmplugin.utils.numerics.max_rel_error`.
"""
from __future__ import annotations

from ..inference.fast import (FAST_MODES, compile_backbone_and_neck, compile_module, enable_fast_inference,
                              native_dtypes, native_low_precision)
from ..utils.numerics import max_rel_error
from .exportable import (PARTS, ExportPart, _IntScaleUpsample, _MatrixAdaptiveAvgPool2d, adaptive_pool_matrix,  # noqa: F401
                         flatten_outputs, make_exportable)
from .onnx import DEFAULT_OPSET, example_input, export_onnx, onnx_parity, onnx_session

__all__ = [
    'PARTS', 'DEFAULT_OPSET', 'ExportPart', 'adaptive_pool_matrix', 'flatten_outputs', 'make_exportable',
    'example_input', 'export_onnx', 'onnx_session', 'onnx_parity', 'max_rel_error', 'FAST_MODES',
    'compile_module', 'compile_backbone_and_neck', 'native_dtypes', 'native_low_precision', 'enable_fast_inference'
]
