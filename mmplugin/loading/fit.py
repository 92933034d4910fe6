"""Does a checkpoint fit a detector / segmentor, and loading it checked: the one path every tool takes.

* :func:`check_checkpoint_fits`: a whole-model (mmengine layout) checkpoint against a model, key by key and shape by
  shape, after converting the published layouts of its plugin backbones exactly as loading will; a message, or
  ``None`` when it fits;
* :func:`checkpoint_fit` / :func:`load_checkpoint_checked`: the same on the part of the model that is used
  (:data:`PART_CHILDREN`: exporting a detector's backbone needs the backbone's weights only, so a backbone-only file
  is enough there and refused where the neck is used too), and loading it;
* :func:`strict_model_state_dict`: the converted state dict that ``load_state_dict(..., strict=True)`` accepts.

``tools/test.py``, ``infer.py``, ``quantize.py``, ``export.py``, ``export_mmdeploy.py`` and ``convert_checkpoint.py``
all load through these (via :func:`mmplugin.apis.build_model` or on a runner's model).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from mmplugin.checkpoint import CheckpointError, format_keys, load_checkpoint_file, state_dict_mismatch
from mmplugin.checkpoint.convert import unwrap_state_dict
from mmplugin.loading.whole_model import (
    ModelConversion,
    backbone_file_layout,
    convert_model_state_dict,
    state_dict_of,
    unwrap_model,
)
from mmplugin.utils.errors import PartError

__all__ = ['PART_CHILDREN', 'check_checkpoint_fits', 'checkpoint_fit', 'load_checkpoint_checked',
           'strict_model_state_dict']

# the model's top-level children each part runs; None: the whole model
PART_CHILDREN: dict[str, tuple[str, ...] | None] = {
    'backbone': ('backbone', ),
    'backbone+neck': ('backbone', 'neck'),
    'model': None,
}


def check_checkpoint_fits(model: nn.Module, ckpt: Any, *, source: str = 'the checkpoint',
                          model_name: str = 'the model') -> str | None:
    """Compare a whole-model checkpoint (mmengine layout) with ``model`` key by key and shape by shape.

    mmengine's ``load_checkpoint`` is not strict: a backbone-only or another model's checkpoint "loads" with a
    warning and leaves a randomly initialised detector. The tools call this first.

    The backbone part of a published whole-model checkpoint (official Swin detection / segmentation repositories,
    mmdet / mmseg model zoos) is converted to the model's layout first
    (:func:`~mmplugin.loading.whole_model.convert_model_state_dict`), exactly as loading will do; everything
    else is compared as it is.

    Args:
        model: the model built from the config (a wrapper or TTA model is unwrapped).
        ckpt: the loaded checkpoint (``{'state_dict': ...}`` or a plain state dict).
        source, model_name: how the messages name the two.

    Returns:
        ``None`` when every key fits, else a message naming the first missing / unexpected / mismatched keys and
        what the checkpoint looks like.
    """
    model = unwrap_model(model)
    sd = state_dict_of(ckpt)
    if sd is None:
        return f'{source} holds no state dict (got {type(ckpt).__name__})'
    conversion = convert_model_state_dict(model, sd)  # published layouts of plugin backbones -> the model's
    sd = conversion.state_dict
    model_sd = model.state_dict()
    missing, unexpected, shapes = state_dict_mismatch(sd, model_sd)
    if not (missing or unexpected or shapes):
        return None
    parts = []
    if missing:
        parts.append(f'{len(missing)} of the model\'s {len(model_sd)} keys are missing '
                     f'(first: {format_keys(missing)})')
    if unexpected:
        parts.append(f'{len(unexpected)} keys are unexpected (first: {format_keys(unexpected)})')
    if shapes:
        parts.append(f'{len(shapes)} shapes differ (checkpoint vs model: {format_keys(shapes, 3)})')
    hint = ''
    if sd and all(f'backbone.{k}' in model_sd for k in sd):
        hint = (' It holds backbone weights only: use it for training as '
                "model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...), not for evaluation.")
    elif not any(k in model_sd for k in sd):
        layout = backbone_file_layout(model, ckpt)
        hint = (f' It holds backbone weights only ({layout} layout): use it for training as '
                "model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...), not for evaluation." if layout
                else ' No key matches: it is for another model or config.')
    done = conversion.describe()
    if done:
        hint += f' (Compared after this conversion: {done}.)'
    for problem in conversion.problems():
        hint += f' Note: {problem}.'
    return f'{source} does not fit {model_name}: ' + '; '.join(parts) + '.' + hint


class _Part(nn.Module):
    """The children of ``model`` that ``names`` lists, under their own names (their ``state_dict`` keys are the
    whole model's keys of that part)."""

    def __init__(self, model: nn.Module, names: Sequence[str]):
        super().__init__()
        for name in names:
            child = getattr(model, name, None)
            if not isinstance(child, nn.Module):
                raise PartError(f'{type(model).__name__} has no {name}: choose a part it has')
            self.add_module(name, child)


def _part_checkpoint(ckpt: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors of the part made of the children ``names`` (keys ``backbone.*``, ``neck.*``, ...).

    A file without any ``backbone.`` key is a backbone-only file (an ImageNet classifier, a converted backbone):
    its keys are the backbone's, so they get the ``backbone.`` prefix; the other children then find nothing.
    """
    sd = state_dict_of(ckpt)
    if sd is not None and any(k.startswith('backbone.') for k in sd):
        return {k: v for k, v in sd.items() if k.split('.', 1)[0] in names}
    backbone = unwrap_state_dict(ckpt)  # CheckpointError when the file holds no tensors
    return {f'backbone.{k}': v for k, v in backbone.items()}


def _part_and_checkpoint(model: nn.Module, ckpt: Any, part: str | None) -> tuple[nn.Module, Any]:
    """The module holding the ``part`` in use and the checkpoint restricted to that part (the whole model and the
    checkpoint as they are for ``part=None``)."""
    model = unwrap_model(model)
    if part is not None and part not in PART_CHILDREN:
        raise PartError(f'part must be one of {tuple(PART_CHILDREN)}, got {part!r}')
    names = PART_CHILDREN.get(part) if part is not None else None
    if names is None:
        return model, ckpt
    return _Part(model, names), {'state_dict': _part_checkpoint(ckpt, names)}


def checkpoint_fit(model: nn.Module, ckpt: Any, *, part: str | None = None, source: str = 'the checkpoint',
                   model_name: str = 'the model') -> str | None:
    """Whether the loaded checkpoint ``ckpt`` fits the ``part`` of ``model`` that is used (nothing is loaded).

    Args:
        model: the detector / segmentor (wrappers are unwrapped).
        ckpt: a checkpoint loaded with :func:`mmplugin.checkpoint.load_checkpoint_file`.
        part: a key of :data:`PART_CHILDREN`; only that part's keys are compared (None: the whole model).
        source, model_name: how the message names the file and the model (e.g. the config).

    Returns:
        None when it fits, else the message of :func:`check_checkpoint_fits`.
    """
    target, used = _part_and_checkpoint(model, ckpt, part)
    what = model_name if part in (None, 'model') else f'the {part} of {model_name}'
    return check_checkpoint_fits(target, used, source=source, model_name=what)


def load_checkpoint_checked(model: nn.Module, checkpoint: str | Mapping, *, part: str | None = None,
                            strict: bool = True, source: str | None = None,
                            model_name: str = 'the model') -> str | None:
    """Load ``checkpoint`` (weights-only) into ``model`` after checking that it fits the ``part`` that is used
    (:func:`checkpoint_fit`); published layouts of the plugin's backbones are converted as they load.

    Args:
        model: the detector / segmentor (wrappers are unwrapped).
        checkpoint: a path or http(s) URL, or a checkpoint already loaded with
            :func:`mmplugin.checkpoint.load_checkpoint_file`.
        part: a key of :data:`PART_CHILDREN`; only that part's keys are compared and loaded (None: the whole model).
        strict: a checkpoint that does not fit raises; otherwise it is loaded as far as it fits and the problem
            returned (missing weights stay as they are).
        source, model_name: how messages name the file (default: the path) and the model (e.g. the config).

    Returns:
        None when it fits, else the message of :func:`checkpoint_fit` (``strict=False``).

    Raises:
        CheckpointError: the file cannot be read safely, holds no state dict, or does not fit (``strict``).
    """
    loaded = isinstance(checkpoint, Mapping)
    ckpt = checkpoint if loaded else load_checkpoint_file(checkpoint)
    source = source or ('the checkpoint' if loaded else str(checkpoint))
    problem = checkpoint_fit(model, ckpt, part=part, source=source, model_name=model_name)
    if problem and strict:
        raise CheckpointError(problem)
    target, used = _part_and_checkpoint(model, ckpt, part)
    sd = state_dict_of(used)
    if sd is None:
        raise CheckpointError(problem or f'{source} holds no state dict')
    own = target.state_dict()
    converted = convert_model_state_dict(target, sd).state_dict
    target.load_state_dict({k: v for k, v in converted.items()
                            if k in own and getattr(v, 'shape', None) == own[k].shape}, strict=False)
    return problem


def strict_model_state_dict(model: nn.Module, ckpt: object, *, source: str = 'the checkpoint',
                            model_name: str = 'the model') -> tuple[dict[str, torch.Tensor], ModelConversion]:
    """The whole-model state dict that ``model.load_state_dict(..., strict=True)`` accepts, from a checkpoint in any
    supported layout (``tools/convert_checkpoint.py --config``).

    Args:
        model: the detector / segmentor built from the target config.
        ckpt: the loaded checkpoint (``{'state_dict': ...}`` or a plain state dict).
        source, model_name: how an error message names the two.

    Returns:
        ``(state_dict, conversion)``: every key of ``model.state_dict()`` in its order (BatchNorm counters the file
        lacks are taken from the model), and what was converted.

    Raises:
        CheckpointError: the converted file still does not fit (the message of
            :func:`check_checkpoint_fits`).
    """
    model = unwrap_model(model)
    problem = check_checkpoint_fits(model, ckpt, source=source, model_name=model_name)
    if problem:
        raise CheckpointError(problem)
    conversion = convert_model_state_dict(model, state_dict_of(ckpt))
    own = model.state_dict()
    out = {k: conversion.state_dict[k] if k in conversion.state_dict else v.clone() for k, v in own.items()}
    return out, conversion
