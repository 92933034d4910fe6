"""Backbone + neck in OpenVINO or onnxruntime, heads in PyTorch: ``tools/test.py --runtime`` and
``tools/infer.py --runtime``.

Why: on a CPU the deployment runtimes run the backbone's small ops (norms, activations, window gathers, softmax)
fused and the GEMMs on their own kernels, ahead of eager PyTorch (docs/benchmarks.md), while the heads of a two-stage
detector need RoIAlign and NMS, which only mmcv / mmdeploy's custom ops provide. So the half of the model that
both mmdet detectors and mmseg segmentors call ``extract_feat`` (image ``(B, 3, H, W)`` -> the neck's maps, or the
backbone's where the model has no neck, e.g. UperNet) goes to the runtime, and the heads stay in PyTorch on the
returned fp32 maps: the metric differs from eager's only by the runtime's rounding.

How: after the checkpoint is loaded, :class:`RuntimeFeatures` exports ``extract_feat`` once to ONNX with dynamic
batch / height / width (:func:`mmplugin.export.export_onnx`) into a temporary folder and replaces the model's
``extract_feat``. OpenVINO then compiles one model per input shape (static shapes: its fastest kernels and memory
plan), kept in a small least-recently-used cache, so the compile is paid once per padded test size; onnxruntime runs
one session for every shape. Precision: fp32 by default; with ``--fast``, OpenVINO's bf16 inference precision where
the CPU has bf16 kernels (AVX512-BF16, AMX), as ``--fast`` does for the PyTorch path.
"""
from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time

import torch
from torch import nn

from mmplugin.utils.errors import ConfigValueError

__all__ = ['RUNTIMES', 'RuntimeFeatures', 'compile_openvino', 'enable_runtime', 'runtime_precision']

RUNTIMES = ('pytorch', 'openvino', 'onnxruntime')
_OV_PRECISION = {None: 'f32', torch.bfloat16: 'bf16', torch.float16: 'f16'}


def runtime_precision(runtime: str, fast: str | None, device: torch.device | str = 'cpu') -> str:
    """The runtime's inference precision for ``--fast MODE`` (None: no ``--fast``): ``'f32'``, ``'bf16'`` or
    ``'f16'``. ``auto`` takes the CPU's native reduced precision (:func:`mmplugin.inference.fast.native_low_precision`),
    f32 where it has none. onnxruntime's CPU kernels are fp32 only, so ``--fast`` with it is an error, not ignored."""
    from mmplugin.inference.fast import _DTYPES, FAST_MODES, native_low_precision
    if fast is None:
        return 'f32'
    if fast not in FAST_MODES:
        raise ConfigValueError(f'--fast must be one of {FAST_MODES}, got {fast!r}')
    if runtime == 'onnxruntime':
        raise ConfigValueError('--fast with --runtime onnxruntime: onnxruntime runs the exported fp32 graph on a CPU; '
                               'use --runtime openvino for bf16, or drop --fast')
    dtype = native_low_precision(device) if fast == 'auto' else _DTYPES[fast]
    return _OV_PRECISION[dtype]


def compile_openvino(core, model, shape: tuple[int, ...], precision: str = 'f32', threads: int | None = None):
    """OpenVINO's CPU model of ``model`` (an ``ov.Model``, left unchanged) for the static input ``shape``, in
    inference ``precision`` (``'f32' | 'bf16' | 'f16'``) on ``threads`` threads (default: torch's)."""
    model = model.clone()
    model.reshape({model.inputs[0]: list(shape)})
    return core.compile_model(model, 'CPU', {'INFERENCE_PRECISION_HINT': precision,
                                             'INFERENCE_NUM_THREADS': threads or torch.get_num_threads()})


def _extract_feat_part(model: nn.Module) -> nn.Module:
    """``extract_feat`` as an exportable module: backbone + neck, or the backbone alone where there is no neck."""
    from mmplugin.export import ExportPart
    has_neck = getattr(model, 'with_neck', False) and getattr(model, 'neck', None) is not None
    return ExportPart(model, 'backbone+neck' if has_neck else 'backbone')


class RuntimeFeatures:
    """A drop-in ``extract_feat``: ``(B, 3, H, W)`` fp32 images -> tuple of fp32 ``(B, C_l, H_l, W_l)`` maps.

    Args:
        model (nn.Module): an mmdet detector or mmseg segmentor with its weights loaded (the export bakes them in).
        runtime (str): ``'openvino'`` or ``'onnxruntime'``.
        precision (str): OpenVINO's inference precision, ``'f32' | 'bf16' | 'f16'`` (onnxruntime: ``'f32'`` only).
        threads (int | None): the runtime's threads (default: ``torch.get_num_threads()``, as the eager path).
        cache_size (int): compiled OpenVINO models kept, one per input shape (least recently used dropped).

    Attributes: ``stats``: exports, compiles and their seconds, calls (printed by the tools at the end).
    """

    def __init__(self, model: nn.Module, runtime: str, precision: str = 'f32', threads: int | None = None,
                 cache_size: int = 8):
        if runtime not in RUNTIMES[1:]:
            raise ConfigValueError(f'runtime must be one of {RUNTIMES[1:]}, got {runtime!r}')
        if precision not in _OV_PRECISION.values() or (runtime == 'onnxruntime' and precision != 'f32'):
            raise ConfigValueError(f'precision {precision!r} is not available with {runtime}')
        self.runtime, self.precision = runtime, precision
        self.threads = threads or torch.get_num_threads()
        self.cache_size = cache_size
        self.stats = dict(export_s=0.0, compiles=0, compile_s=0.0, calls=0)
        self._compiled: collections.OrderedDict = collections.OrderedDict()
        if runtime == 'openvino':
            try:
                import openvino as ov
            except ImportError as err:
                raise ConfigValueError('--runtime openvino needs OpenVINO: pip install openvino') from err
            self._core = ov.Core()
        else:
            try:
                import onnxruntime  # noqa: F401
            except ImportError as err:
                raise ConfigValueError('--runtime onnxruntime needs onnxruntime: pip install onnxruntime') from err
        self._dir = tempfile.mkdtemp(prefix='mmplugin-runtime-')
        self.onnx_path = os.path.join(self._dir, 'extract_feat.onnx')
        part = _extract_feat_part(model).eval()
        c = getattr(getattr(model, 'backbone', model), 'in_channels', 3)
        from mmplugin.export import example_input, export_onnx
        t = time.perf_counter()
        export_onnx(part, self.onnx_path, example_input(2, (224, 256), channels=c))
        self.stats['export_s'] = time.perf_counter() - t
        if runtime == 'onnxruntime':
            from mmplugin.export.backends import load
            self._session = load('onnx', self.onnx_path, self.threads)
        else:
            self._model = self._core.read_model(self.onnx_path)

    def _openvino_for(self, shape: tuple[int, ...]):
        compiled = self._compiled.get(shape)
        if compiled is not None:
            self._compiled.move_to_end(shape)
            return compiled
        t = time.perf_counter()
        compiled = compile_openvino(self._core, self._model, shape, self.precision, self.threads)
        self.stats['compiles'] += 1
        self.stats['compile_s'] += time.perf_counter() - t
        self._compiled[shape] = compiled
        if len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return compiled

    def __call__(self, inputs: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, ...]:
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 4:
            raise TypeError(f'--runtime {self.runtime}: extract_feat takes one (B, C, H, W) image tensor, got '
                            f'{type(inputs).__name__}')
        self.stats['calls'] += 1
        x = inputs.detach().float().contiguous().cpu().numpy()
        if self.runtime == 'onnxruntime':
            outs = self._session(torch.from_numpy(x))
        else:
            compiled = self._openvino_for(tuple(x.shape))
            res = compiled({0: x})  # the request's output buffers are reused by the next call: copy them out
            outs = [torch.from_numpy(res[o].copy()) for o in compiled.outputs]
        return tuple(o.to(inputs.device) for o in outs)

    def message(self) -> str:
        """One line for the tools: runtime, precision, the export and compile times so far."""
        s = self.stats
        what = (f'{s["compiles"]} compiled shape(s) in {s["compile_s"]:.1f} s' if self.runtime == 'openvino'
                else 'one session for every shape')
        return (f'--runtime {self.runtime}: backbone + neck in {self.runtime} ({self.precision}, {self.threads} '
                f'threads), heads in PyTorch; exported in {s["export_s"]:.0f} s, {what}, {s["calls"]} call(s)')

    def close(self) -> None:
        """Drop the compiled models and the temporary ONNX file."""
        self._compiled.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self):
        shutil.rmtree(getattr(self, '_dir', ''), ignore_errors=True)


def enable_runtime(model: nn.Module, runtime: str, fast: str | None = None,
                   device: torch.device | str = 'cpu') -> RuntimeFeatures | None:
    """Replace ``model.extract_feat`` by :class:`RuntimeFeatures` (``runtime`` ``'pytorch'``: nothing, None).

    ``model``'s parameters and ``state_dict`` are unchanged (hooks and checkpoints see the loaded weights); the
    runtimes are CPU runtimes, so a model on another device is an error."""
    if runtime == 'pytorch':
        return None
    if runtime not in RUNTIMES:
        raise ConfigValueError(f'--runtime must be one of {RUNTIMES}, got {runtime!r}')
    if torch.device(device).type != 'cpu':
        raise ConfigValueError(f'--runtime {runtime} runs on the CPU; the model is on {device}')
    if not callable(getattr(model, 'extract_feat', None)):
        raise ConfigValueError(f'{type(model).__name__} has no extract_feat(); --runtime serves mmdet detectors '
                               'and mmseg segmentors')
    feats = RuntimeFeatures(model, runtime, runtime_precision(runtime, fast, device))
    model.extract_feat = feats
    return feats
