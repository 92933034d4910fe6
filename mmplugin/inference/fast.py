"""Faster inference without touching the weights: reduced-precision autocast of backbone + neck, and
``torch.compile`` of the plugin's backbones with dynamic sizes.

Not deployment (nothing is exported): ``tools/test.py --fast / --compile``, ``tools/infer.py`` and
``tools/gpu_check.py`` apply these to the mmdet / mmseg model they run. State-dict keys stay unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ['compile_module', 'compile_backbone_and_neck', 'FAST_MODES', 'native_dtypes', 'native_low_precision',
           'enable_fast_inference', 'fast_inference_message']

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


def fast_inference_message(mode: str, dtype: torch.dtype | None, model: nn.Module | None = None) -> str:
    """What the tools print after :func:`enable_fast_inference`: the dtype used, whether freed memory is kept, and how
    many of ``model``'s weights are frozen for packing (the plugin's fused inference ops pack them on first use)."""
    from mmplugin.inference.allocator import retained
    from mmplugin.models.layers.prepack import frozen_count
    frozen = frozen_count(model) if model is not None else 0
    return (f'--fast {mode}: backbone + neck in {dtype or "torch.float32"}, heads in torch.float32'
            + ('; freed memory kept in the process (glibc)' if retained() else '')
            + (f'; {frozen} linear / 1x1 convolution weights frozen for packing (oneDNN)' if frozen else ''))


def enable_fast_inference(model: nn.Module, mode: str = 'auto', device: torch.device | str = 'cpu',
                          prepack: bool = True):
    """Run ``model.extract_feat`` (backbone + neck) under autocast in reduced precision; returns the dtype or None.

    The features are cast back to fp32 before the heads: mmcv's RoIAlign / NMS CPU kernels and the post-processing
    stay fp32 (on a CPU they are about half the time of a Swin-T Mask R-CNN, which bounds the gain: README, Deploy).
    ``mode``:
    ``'auto'`` = :func:`native_low_precision` (a warning and fp32 where the device has none), ``'bf16'`` /
    ``'fp16'`` = that dtype even where it is emulated (to measure its accuracy cost). Works for mmdet detectors
    and mmseg segmentors (both route images through ``extract_feat``); the model's weights stay fp32, so
    checkpoints and ``state_dict`` keys are unchanged. On a CPU it also keeps freed memory in the process
    (:func:`mmplugin.inference.allocator.retain_freed_memory`, glibc: large activations are not page-faulted in
    again on every image), process-wide, and with ``prepack`` (default) treats the model's linear and 1x1
    convolution weights as frozen: the fused inference ops keep them packed in oneDNN's layout, one more copy of
    those weights in memory (:func:`mmplugin.models.layers.prepack.prepack_weights`; fp32 runs use this too).
    ``switch_to_deploy()`` freezes the deployed form's new convolutions itself, before or after this call.
    """
    import warnings
    if mode not in FAST_MODES:
        raise ValueError(f'fast inference mode must be one of {FAST_MODES}, got {mode!r}')
    device = torch.device(device)
    if not callable(getattr(model, 'extract_feat', None)):
        raise TypeError(f'{type(model).__name__} has no extract_feat(); fast inference wraps the backbone + neck of '
                        'mmdet detectors and mmseg segmentors')
    if device.type == 'cpu':
        from mmplugin.inference.allocator import retain_freed_memory
        from mmplugin.models.layers.prepack import prepack_weights
        retain_freed_memory()
        if prepack:
            prepack_weights(model)
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
