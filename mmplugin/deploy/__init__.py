"""Export to ONNX with dynamic batch / height / width, onnxruntime parity checks and torch.compile helpers.

Exporter: ``torch.onnx.export(..., dynamo=True)`` (the default of torch >= 2.9): the model is captured with
``torch.export`` (sizes are symbolic, so padding, shifts, masks and window partitions are computed from the
input's shape inside the graph, see :mod:`mmplugin.models.layers.window_attention`) and translated by onnxscript.
Opset 18 by default: the lowest opset the dynamo exporter targets natively, and what onnxruntime >= 1.14 and
OpenVINO >= 2023.0 read. The TorchScript exporter (``dynamo=False``) is not supported: it records Python
integers computed from sizes as constants.

Parts (``image (B, C, H, W)`` in, a tuple of tensors out):

* ``backbone``: the backbone's NCHW feature maps;
* ``backbone+neck``: the neck's maps (FPN levels) when the model has a neck;
* ``model``: segmentors (mmseg ``EncoderDecoder``: Semantic FPN, UperNet): ``(B, num_classes, H, W)`` logits,
  i.e. the decode head's output resized to the input like ``EncoderDecoder.encode_decode``; single-stage
  detectors: the dense head's raw maps (per level class scores, box deltas, ...). Two-stage detectors need NMS
  and RoIAlign: export them end to end with mmdeploy (``tools/export_mmdeploy.py``,
  :mod:`mmplugin.mmdeploy_compat`), or export ``backbone+neck``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

PARTS = ('backbone', 'backbone+neck', 'model')
DEFAULT_OPSET = 18


def flatten_outputs(out) -> tuple[torch.Tensor, ...]:
    """The tensors of a (nested) tuple / list of outputs, in order: what an exported graph returns."""
    if isinstance(out, torch.Tensor):
        return (out, )
    flat = []
    for o in out:
        flat.extend(flatten_outputs(o))
    return tuple(flat)


class _IntScaleUpsample(nn.Module):
    """mmseg's ``Upsample(scale_factor=k)`` for an integer ``k``, with the output size computed as ``k * size``.

    mmseg computes ``int(size * float(k))``: a float of a symbolic size, which torch.export specialises to the
    example's value (so the exported model silently resizes to the example's size). Same output in eager.
    """

    def __init__(self, factors: tuple[int, int], mode: str, align_corners):
        super().__init__()
        self.factors, self.mode, self.align_corners = factors, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[-2] * self.factors[0], x.shape[-1] * self.factors[1])
        return F.interpolate(x, size=size, mode=self.mode, align_corners=self.align_corners)


def adaptive_pool_matrix(n, s: int, like: torch.Tensor) -> torch.Tensor:
    """``(s, n)`` averaging matrix of ``adaptive_avg_pool1d`` from ``n`` to ``s`` positions.

    Row ``i`` averages positions ``floor(i n / s) <= j < ceil((i + 1) n / s)`` (PyTorch's definition);
    ``n`` may be a symbolic size, so the matrix is computed inside a captured graph.
    """
    i = torch.arange(s, device=like.device)
    j = torch.arange(n, device=like.device)
    start = torch.div(i * n, s, rounding_mode='floor')
    end = torch.div((i + 1) * n + s - 1, s, rounding_mode='floor')
    inside = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
    return inside.to(like.dtype) / (end - start).to(like.dtype)[:, None]


class _MatrixAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d(output_size)`` as two matrix products, ``P_h @ x @ P_w^T``.

    ``x (B, C, H, W) -> (B, C, s_h, s_w)``. The exporters decompose adaptive pooling with gather indices computed
    from the example's size (onnxruntime then fails or reads wrong positions at other sizes); the averaging
    matrices here are built from the input's symbolic size. Equal to PyTorch's up to summation order.
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, ) * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh, sw = self.output_size
        if sh is not None:
            x = torch.matmul(adaptive_pool_matrix(x.shape[-2], sh, x), x)
        if sw is not None:
            x = torch.matmul(x, adaptive_pool_matrix(x.shape[-1], sw, x).transpose(0, 1))
        return x


def make_exportable(module: nn.Module) -> nn.Module:
    """Replace, in place, submodules whose forward bakes the example size into a captured graph; returns module.

    Today: mmseg ``Upsample`` with an integer ``scale_factor`` (Semantic FPN's scale heads; non-integer factors
    raise, naming the module) and ``nn.AdaptiveAvgPool2d`` (UperNet's pyramid pooling).
    """
    for name, child in list(module.named_children()):
        if type(child) is nn.AdaptiveAvgPool2d:
            setattr(module, name, _MatrixAdaptiveAvgPool2d(child.output_size))
            continue
        if type(child).__name__ == 'Upsample' and type(child).__module__.startswith('mmseg') and not child.size:
            f = child.scale_factor
            factors = tuple(f) if isinstance(f, (tuple, list)) else (f, f)
            if any(float(v) != int(v) for v in factors):
                raise ValueError(f'{name}: mmseg Upsample with scale_factor={f} cannot be exported with dynamic sizes '
                                 '(the output size would be baked in); use an integer factor')
            setattr(module, name, _IntScaleUpsample(tuple(int(v) for v in factors), child.mode, child.align_corners))
        else:
            make_exportable(child)
    return module


class ExportPart(nn.Module):
    """``image (B, C, H, W) -> tuple of tensors`` for one part of a detector or segmentor (see module doc).

    Args:
        model (nn.Module): an mmdet detector, an mmseg segmentor, or a bare backbone (then only ``'backbone'``).
        part (str): ``'backbone' | 'backbone+neck' | 'model'``.
    """

    def __init__(self, model: nn.Module, part: str = 'backbone'):
        super().__init__()
        if part not in PARTS:
            raise ValueError(f'part must be one of {PARTS}, got {part!r}')
        self.part = part
        make_exportable(model)
        self.backbone = getattr(model, 'backbone', model)
        self.neck = getattr(model, 'neck', None) if getattr(model, 'with_neck', False) else None
        self.head = None
        if part == 'backbone+neck' and self.neck is None:
            raise ValueError(f"part 'backbone+neck': {type(model).__name__} has no neck; use --part backbone")
        if part == 'model':
            if hasattr(model, 'decode_head'):  # mmseg EncoderDecoder
                self.head = model.decode_head
                self.kind = 'segmentor'
            elif hasattr(model, 'bbox_head') and not hasattr(model, 'roi_head'):  # mmdet single-stage
                self.head = model.bbox_head
                self.kind = 'dense_detector'
            else:
                raise ValueError(
                    f"part 'model' is not exportable for {type(model).__name__}: its predictions need NMS / RoIAlign "
                    "custom ops. Use mmdeploy's onnxruntime pipeline (tools/export_mmdeploy.py) or "
                    "--part backbone+neck")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feats = self.backbone(x)
        if self.part == 'backbone':
            return tuple(feats)
        if self.neck is not None:
            feats = self.neck(feats)
        if self.part == 'backbone+neck':
            return tuple(feats)
        if self.kind == 'segmentor':
            logits = self.head(feats)
            return (F.interpolate(logits, size=x.shape[2:], mode='bilinear', align_corners=self.head.align_corners), )
        return flatten_outputs(self.head(feats))


def example_input(batch: int = 2, size: tuple[int, int] = (224, 256), channels: int = 3) -> torch.Tensor:
    """Example input for export. No dimension may be 1 (torch.export specialises size-1 dims to the constant 1),
    and ``size`` should not be a multiple of everything (so no divisibility is assumed)."""
    if batch < 2 or min(size) < 2:
        raise ValueError(f'example batch and sizes must be >= 2 (a size-1 dim is specialised), got batch={batch}, '
                         f'size={tuple(size)}')
    return torch.randn(batch, channels, *size)


def export_onnx(module: nn.Module, out: str, example: torch.Tensor | None = None, opset: int = DEFAULT_OPSET,
                output_prefix: str = 'out') -> list[str]:
    """Export ``module`` (one image tensor in, a tuple of tensors out) with dynamic batch, height and width.

    Returns the output names. The input is named ``input``; outputs ``{output_prefix}{i}``.
    Raises RuntimeError naming the exporter's complaint when the graph cannot be captured with dynamic sizes.
    """
    import onnx  # noqa: F401  (a clear ImportError before the long capture)
    import onnxscript  # noqa: F401
    from torch.export import Dim

    module = module.eval()
    example = example_input() if example is None else example
    with torch.no_grad():
        n_out = len(flatten_outputs(module(example)))
    names = [f'{output_prefix}{i}' for i in range(n_out)]
    dyn = {0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC}
    try:
        prog = torch.onnx.export(module, (example, ), dynamo=True, dynamic_shapes=(dyn, ), opset_version=opset,
                                 input_names=['input'], output_names=names, optimize=True, verbose=False)
    except Exception as err:  # noqa: BLE001  (re-raised with the part of the message that matters)
        raise RuntimeError(f'ONNX export with dynamic batch/height/width failed: {str(err)[:4000]}') from err
    prog.save(out)
    return names


def onnx_session(path: str):
    """An onnxruntime CPU session (all graph optimisations, deterministic input/output names)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])


def max_rel_error(ours: Sequence, ref: Sequence[torch.Tensor]) -> float:
    """``max over outputs of max|a - b| / max|b|``; NaN anywhere in ``ours`` that ``ref`` lacks gives inf."""
    if len(ours) != len(ref):
        raise ValueError(f'{len(ours)} outputs against {len(ref)} reference outputs')
    worst = 0.0
    for a, b in zip(ours, ref):
        a, b = torch.as_tensor(a).double(), b.detach().double()
        if a.shape != b.shape:
            raise ValueError(f'output shape {tuple(a.shape)} differs from the reference {tuple(b.shape)}')
        if not torch.equal(a.isnan(), b.isnan()):
            return math.inf
        a, b = torch.nan_to_num(a), torch.nan_to_num(b)
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item())
    return worst


def onnx_parity(module: nn.Module, path: str, shapes: Sequence[tuple[int, int, int, int]], seed: int = 0,
                session=None) -> dict[tuple[int, ...], float]:
    """Max relative error of onnxruntime against eager ``module`` for random inputs of each ``(B, C, H, W)``."""
    sess = session or onnx_session(path)
    g = torch.Generator().manual_seed(seed)
    errs = {}
    module = module.eval()
    for shape in shapes:
        x = torch.randn(*shape, generator=g)
        with torch.no_grad():
            ref = flatten_outputs(module(x))
        got = sess.run(None, {'input': x.numpy()})
        errs[tuple(shape)] = max_rel_error([torch.from_numpy(o) for o in got], ref)
    return errs


def compile_module(module: nn.Module, backend: str = 'inductor', **kwargs) -> nn.Module:
    """Compile ``module``'s forward in place with ``fullgraph=True, dynamic=True`` (state-dict keys unchanged).

    The plugin's backbones capture as one graph for every input size (at most one recompile, where a batch of 1
    meets a single window). mmcv ops (RoIAlign, NMS) in heads break graphs, so compile backbones and necks, not whole
    detectors.
    """
    # Size-oblivious reasoning for backed sizes: without it dynamo guards every derived size (window counts, the
    # last stage's width) on being 1, and each new input size that makes one of them 1 or not-1 recompiles.
    # Process-wide: it only removes 0/1 specialisation, the graphs stay valid for every size (tests check).
    import torch.fx.experimental._config as fx_config
    fx_config.backed_size_oblivious = True
    kwargs.setdefault('fullgraph', True)
    kwargs.setdefault('dynamic', True)
    module.compile(backend=backend, **kwargs)
    return module


def compile_backbone_and_neck(model: nn.Module, backend: str = 'inductor') -> nn.Module:
    """Compile ``model.backbone`` (and ``model.neck`` if any) in place; returns ``model``."""
    compile_module(model.backbone, backend)
    neck = getattr(model, 'neck', None)
    if isinstance(neck, nn.Module):
        compile_module(neck, backend, fullgraph=False)  # third-party necks may hold graph breaks
    return model


# ---------------------------------------------------------------------------------------------------- fast inference
FAST_MODES = ('auto', 'bf16', 'fp16')
_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def native_dtypes(device: torch.device | str = 'cpu') -> set[torch.dtype]:
    """Reduced-precision dtypes ``device`` computes in hardware.

    CUDA: fp16 always, bf16 from compute capability 8.0 (Ampere). CPU: bf16 with AVX512-BF16 or AMX (e.g. Sapphire
    Rapids, Zen 4); other CPUs (AVX2, AVX512 without BF16) emulate it, slower than fp32.
    """
    device = torch.device(device)
    if device.type == 'cuda':
        major = torch.cuda.get_device_capability(device)[0]
        return {torch.float16, torch.bfloat16} if major >= 8 else {torch.float16}
    if device.type == 'cpu' and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return {torch.bfloat16}
    return set()


def native_low_precision(device: torch.device | str = 'cpu') -> torch.dtype | None:
    """The dtype ``--fast auto`` picks: bf16 where native (its range needs no loss scaling), else fp16 where
    native, else None (fp32)."""
    native = native_dtypes(device)
    return torch.bfloat16 if torch.bfloat16 in native else (torch.float16 if native else None)


def enable_fast_inference(model: nn.Module, mode: str = 'auto', device: torch.device | str = 'cpu'):
    """Run ``model.extract_feat`` (backbone + neck) under autocast in reduced precision; returns the dtype or None.

    The features are cast back to fp32 before the heads: mmcv's RoIAlign / NMS CPU kernels and the post-processing
    stay fp32 (on a CPU they are about half the time of a Swin-T Mask R-CNN, which bounds the gain: README, Deploy).
    ``mode``:
    ``'auto'`` = :func:`native_low_precision` (a warning and fp32 where the device has none), ``'bf16'`` /
    ``'fp16'`` = that dtype even where it is emulated (to measure its accuracy cost). Works for mmdet detectors
    and mmseg segmentors (both route images through ``extract_feat``); the model's weights stay fp32, so
    checkpoints and ``state_dict`` keys are unchanged.
    """
    import warnings
    if mode not in FAST_MODES:
        raise ValueError(f'fast inference mode must be one of {FAST_MODES}, got {mode!r}')
    device = torch.device(device)
    if not callable(getattr(model, 'extract_feat', None)):
        raise TypeError(f'{type(model).__name__} has no extract_feat(); fast inference wraps the backbone + neck of '
                        'mmdet detectors and mmseg segmentors')
    if mode == 'auto':
        dtype = native_low_precision(device)
        if dtype is None:
            warnings.warn(f'--fast: {device.type} has no native reduced-precision kernels (CPU needs AVX512-BF16 or '
                          'AMX); running fp32. Pass --fast bf16 to force bf16 (emulated: slower, same accuracy cost)',
                          stacklevel=2)
            return None
    else:
        dtype = _DTYPES[mode]
        if dtype not in native_dtypes(device):
            warnings.warn(f'--fast {mode}: {device.type} has no native {mode} kernels; it runs emulated (slower than '
                          'fp32). Useful to measure the accuracy cost only', stacklevel=2)
    plain = model.extract_feat

    def extract_feat(inputs, *args, **kwargs):
        with torch.autocast(device.type, dtype=dtype):
            feats = plain(inputs, *args, **kwargs)
        if isinstance(feats, torch.Tensor):
            return feats.float()
        return type(feats)(f.float() for f in feats)

    model.extract_feat = extract_feat
    return dtype
