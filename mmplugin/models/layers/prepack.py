"""Linear weights (and 1x1 convolution weights) kept in oneDNN's blocked layout, and in bf16 where the product runs in
bf16, for CPU inference.

Why: oneDNN's linear reorders a plain ``(N, K)`` weight into its blocked layout on every call, and under bf16
autocast the weight is first cast to bf16, on every call too. Swin-T at 800x1216, 2 threads, AMD EPYC family 25
model 17 (Zen 4), all linears of one forward timed at their shapes (``tools/speed_table.py`` rows ``GEMMs alone``):
fp32 785 ms plain, 724 ms prepacked; bf16 397 ms cast on every call, 389 ms cast once, 372 ms prepacked.

A dense 1x1 convolution on a channels_last map is a linear over its pixels, and runs as one at inference
(:func:`mmplugin.models.layers.fusion.conv_act` / ``conv_add``: SwiftFormer's pointwise convolutions), so its weight
is packed the same way where it is a parameter: every one of them in the deployed form (``switch_to_deploy()``
folds BatchNorm and layer scales into constant weights), in eval mode those with nothing to fold on the fly.

Frozen weights only: :func:`prepack_weights` marks a module's parameters as constant for inference (what
``--fast`` does), and the fused linears of :mod:`mmplugin.models.layers.fusion` then use a packed copy per parameter
and dtype, made on first use. A parameter updated in place through itself (``load_state_dict``, ``copy_``, an
optimizer step: its version counter changes) or given new storage is packed again; writes through ``.data``, which
bypass the version counter, are not seen. The packed copies take the weights' memory once more (bf16: half) and
are freed with their parameters or by :func:`release_prepacked`.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from mmplugin.models.layers.gemm import onednn_ops_available

__all__ = ['prepack_weights', 'release_prepacked', 'prepacked', 'frozen_count']

_AVAILABLE = onednn_ops_available('_linear_pointwise', '_reorder_linear_weight')
_FROZEN: dict[int, weakref.ref] = {}  # id(parameter) -> weak reference: parameters that may be prepacked
_PACKED: dict[tuple[int, torch.dtype], tuple] = {}  # (id, dtype) -> (mark, stamp, source storage, packed weight)


def _forget(key: int) -> None:
    _FROZEN.pop(key, None)
    for entry in [k for k in list(_PACKED) if k[0] == key]:  # a snapshot: packing may insert meanwhile
        _PACKED.pop(entry, None)


def prepack_weights(module: nn.Module) -> nn.Module:
    """Mark every linear and 1x1 convolution weight of ``module`` as frozen for CPU inference (packed on first use,
    see the module docstring); returns ``module``. State dicts, checkpoints and training are unaffected: training
    paths never read the packed copies. Modules built later need another call (SwiftFormer's ``switch_to_deploy()``
    freezes the convolutions it makes itself)."""
    for m in module.modules():
        if (isinstance(m, nn.Linear) or (isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1))) and _AVAILABLE:
            key = id(m.weight)
            _FROZEN[key] = weakref.ref(m.weight, lambda _, key=key: _forget(key))
    return module


def release_prepacked(module: nn.Module | None = None) -> None:
    """Drop the packed copies and the frozen marks of ``module``'s parameters (of every module where None)."""
    keys = list(_FROZEN) if module is None else [id(p) for p in module.parameters() if id(p) in _FROZEN]
    for key in keys:
        _forget(key)


def prepacked(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The packed ``dtype`` copy of a frozen ``(N, K)`` linear weight (or ``(N, K, 1, 1)`` 1x1 convolution weight)
    for ``torch.ops.mkldnn._linear_pointwise``, or None where ``weight`` is not frozen (a computed tensor, a
    parameter never passed to :func:`prepack_weights`, or one made under ``torch.inference_mode()``, which keeps no
    version counter).

    A copy serves while its parameter has the same version (in-place writes through the parameter bump it), the same
    storage, offset, shape, strides and dtype. The entry holds the storage it was packed from, so that memory cannot
    be freed and handed to new values at the same address (``module.half().float()``, ``param.data = ...``) while
    the copy is kept."""
    key = id(weight)
    ref = _FROZEN.get(key)
    if (ref is None or ref() is not weight or weight.device.type != 'cpu' or weight.dim() not in (2, 4)
            or weight.is_inference()):
        return None
    storage = weight.untyped_storage()
    stamp = (weight._version, storage.data_ptr(), weight.storage_offset(), tuple(weight.shape), weight.stride(),
             weight.dtype)
    entry = _PACKED.get((key, dtype))
    if entry is None or entry[0] is not ref or entry[1] != stamp:
        with torch.no_grad():  # a 1x1 convolution's weight: its (N, K) matrix
            matrix = weight.detach().reshape(weight.shape[0], weight.shape[1])
            packed = torch.ops.mkldnn._reorder_linear_weight(matrix.to(dtype), 4096)
        entry = _PACKED[(key, dtype)] = (ref, stamp, storage, packed)
    return entry[3]


def frozen_count(module: nn.Module | None = None) -> int:
    """How many of ``module``'s parameters (of the process's, where None) are frozen for packing."""
    if module is None:
        return sum(ref() is not None for ref in list(_FROZEN.values()))
    return sum(1 for p in module.parameters() if (ref := _FROZEN.get(id(p))) is not None and ref() is p)
