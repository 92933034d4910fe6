"""Post-training static int8 for onnxruntime: QDQ ONNX from the fp32 export, calibrated on images.

The part is prepared like the XNNPACK path (:func:`mmplugin.quantization.pt2e.int8_ready`: BN / layer scales folded,
rsqrt normalisations as their own modules), exported with :func:`mmplugin.export.export_onnx` (dynamic batch /
height / width), then ``onnxruntime.quantization.quantize_static`` inserts QuantizeLinear / DequantizeLinear pairs:
int8 weights per output channel (symmetric), int8 activations per tensor (min / max calibration), QDQ format
(onnxruntime fuses them into integer kernels at load). ``keep_float`` names modules as in the XNNPACK path; their
ONNX nodes are found through the exporter's ``pkg.torch.onnx.class_hierarchy`` / ``name_scopes`` metadata and
excluded from quantisation.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from mmplugin.quantization.pt2e import DEFAULT_KEEP_FLOAT_BY_BACKEND, resolve_keep_float

_DEFAULT = DEFAULT_KEEP_FLOAT_BY_BACKEND['onnxruntime']

__all__ = ['float_node_names', 'quantize_onnxruntime', 'OrtRunner']


def _meta(node) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def float_node_names(onnx_model, module: nn.Module, keep_float=_DEFAULT) -> list[str]:
    """Names of the ONNX nodes that ``keep_float`` (see :func:`~mmplugin.quantization.pt2e.resolve_keep_float`)
    selects: nodes recorded under a kept module class or inside a kept module name."""
    types, names = resolve_keep_float(module, keep_float)
    type_names = [f'{t.__module__}.{t.__qualname__}' for t in types]
    picked = []
    for node in onnx_model.graph.node:
        meta = _meta(node)
        hierarchy = meta.get('pkg.torch.onnx.class_hierarchy', '')
        scopes = meta.get('pkg.torch.onnx.name_scopes', '')
        if any(t in hierarchy for t in type_names) or any(f"'{n}'" in scopes or f"'{n}." in scopes
                                                            for n in names):
            picked.append(node.name)
    return picked


class _Reader:
    """onnxruntime ``CalibrationDataReader`` over a list of ``(1, 3, H, W)`` images."""

    def __init__(self, images: Sequence[torch.Tensor]):
        self.images = iter([{'input': x.detach().float().numpy()} for x in images])

    def get_next(self):
        return next(self.images, None)


def quantize_onnxruntime(module: nn.Module, calibration: Sequence[torch.Tensor], out: str,
                         keep_float=_DEFAULT, example: torch.Tensor | None = None) -> dict:
    """Export ``module`` (prepared by ``int8_ready``) to ONNX and write its static int8 QDQ form to ``out``.

    Returns ``dict(path=out, float_nodes=[names kept float], fp32_path=the fp32 .onnx beside it)``.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from mmplugin.export import export_onnx
    if not calibration:
        raise ValueError('quantize_onnxruntime needs at least one calibration image')
    kept_types, kept_names = resolve_keep_float(module, keep_float)  # a bad option fails before the export
    fp32 = os.path.splitext(out)[0] + '.fp32.onnx'
    batch_example = example if example is not None else torch.cat([calibration[0]] * 2)
    export_onnx(module.eval(), fp32, batch_example)
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, 'pre.onnx')
        quant_pre_process(fp32, pre, skip_symbolic_shape=True)
        model = onnx.load(pre)
        excluded = float_node_names(model, module, keep_float)
        if not excluded and (kept_types or kept_names):
            # the exporter's module metadata did not survive pre-processing: quantising everything instead of
            # what was asked to stay float would be silently wrong
            raise RuntimeError(f'keep_float={keep_float!r} selects modules of {type(module).__name__}, but no ONNX '
                               'node carries their module metadata after onnxruntime pre-processing')
        quantize_static(pre, out, _Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=excluded,
                        extra_options=dict(ActivationSymmetric=False, WeightSymmetric=True))
    return dict(path=out, float_nodes=excluded, fp32_path=fp32)


class OrtRunner:
    """``runner(x) -> tuple of tensors`` for an ONNX file on onnxruntime's CPU provider."""

    def __init__(self, path: str):
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # no busy-waiting of the intra-op threads between runs: they would take the cores from PyTorch when the
        # two alternate in one process (timing, or an int8 backbone inside a float model)
        opts.add_session_config_entry('session.intra_op.allow_spinning', '0')
        self.session = ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = self.session.run(None, {'input': np.ascontiguousarray(x.detach().float().numpy())})
        return tuple(torch.from_numpy(o) for o in outs)
