"""Format-independent checkpoint helpers: unwrap containers, strip prefixes, compare against a model.

All functions are pure: they take and return plain ``dict[str, Tensor]`` and never touch a model's parameters.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from mmplugin.checkpoint.errors import CheckpointError
from mmplugin.checkpoint.fit import require_fit, strip_module_prefix

__all__ = ['unwrap_state_dict', 'strip_prefixes', 'LoadPlan', 'plan_load', 'rename_keys', 'route_output_norms']

_CONTAINER_KEYS = ('state_dict', 'model', 'model_ema', 'module')


def unwrap_state_dict(ckpt: object, prefix: str | None = None) -> dict[str, torch.Tensor]:
    """Return the tensor dict inside a checkpoint, whatever its container.

    Accepts a raw state dict, ``{'state_dict': ...}`` (mmengine), ``{'model': ...}`` (official
    releases, timm training scripts), ``{'module': ...}``; removes ``module.`` (DataParallel) prefixes; when the
    keys carry ``backbone.`` (a whole detector or segmentor), keeps only the backbone's keys. ``prefix`` selects
    keys explicitly (mmengine's ``init_cfg=dict(type='Pretrained', prefix='backbone.')``).

    Raises:
        CheckpointError: the object holds no tensor dict.
    """
    sd = ckpt
    for _ in range(2):  # e.g. {'state_dict': {'model': ...}} exists in the wild
        if isinstance(sd, Mapping):
            for key in _CONTAINER_KEYS:
                if key in sd and isinstance(sd[key], Mapping) and sd[key]:
                    sd = sd[key]
                    break
    if not isinstance(sd, Mapping) or not sd:
        raise CheckpointError(f'the checkpoint holds no state dict (got {type(ckpt).__name__}'
                              f'{" with keys " + str(list(ckpt)[:8]) if isinstance(ckpt, Mapping) else ""})')
    tensors = {str(k): v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f'the checkpoint has no tensors (keys: {list(sd)[:8]})')
    tensors = strip_module_prefix(tensors)
    if prefix:
        tensors = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if not tensors:
            raise CheckpointError(f'no key in the checkpoint starts with prefix {prefix!r}')
    elif any(k.startswith('backbone.') for k in tensors):
        tensors = {k[len('backbone.'):]: v for k, v in tensors.items() if k.startswith('backbone.')}
    return tensors


def strip_prefixes(sd: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Remove any of ``prefixes`` from the start of every key (repeatedly, e.g. ``module.module.``)."""
    out = {}
    for k, v in sd.items():
        changed = True
        while changed:
            changed = False
            for p in prefixes:
                if k.startswith(p):
                    k, changed = k[len(p):], True
        out[k] = v
    return out


def rename_keys(sd: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Apply ordered ``(regex, replacement)`` rules to every key."""
    compiled = [(re.compile(p), r) for p, r in rules]
    out = {}
    for k, v in sd.items():
        for pat, rep in compiled:
            k = pat.sub(rep, k)
        out[k] = v
    return out


@dataclass
class LoadPlan:
    """What loading a converted state dict into a model will do: the tensors to load and the model keys that stay
    as initialised (allowed-missing keys such as fresh output norms)."""
    state_dict: dict[str, torch.Tensor]
    missing: list[str] = field(default_factory=list)


def route_output_norms(sd: dict[str, torch.Tensor], out_indices, num_stages: int = 4,
                       copy_classifier_norm: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Decide what a classifier's final ``norm.*`` becomes, and drop output norms the model lacks.

    By default the classifier norm is dropped and the model's last output norm keeps its fresh initialisation, as
    the papers' detection and segmentation code does (mmdet's and the official Swin detection code's
    ``load_state_dict(..., strict=False)`` and the official SwiftFormer ``fork_feat`` loader ignore ``norm.*``).
    ``copy_classifier_norm=True`` initialises ``norm{num_stages - 1}`` from it instead: it normalises the same
    last-stage features (unless the checkpoint already has that output norm).

    Args:
        sd: state dict in the family's layout, classifier keys included.
        out_indices: the model's returned stages (only their ``norm{i}`` exist).
        num_stages: stages of the network the checkpoint was trained as; its last one is the classifier norm's.
        copy_classifier_norm: copy ``norm.*`` to ``norm{num_stages - 1}.*``.

    Returns:
        ``(state_dict, dropped_keys)``; the input is not modified.

    Raises:
        CheckpointError: ``copy_classifier_norm`` is asked for but cannot be honoured: the model does not return
            stage ``num_stages - 1``, or the checkpoint has neither a classifier norm nor that output norm.
    """
    out_indices = tuple(out_indices)
    last = num_stages - 1
    out, dropped = dict(sd), []
    classifier = [k for k in out if k.startswith('norm.')]
    if copy_classifier_norm:
        if last not in out_indices:
            raise CheckpointError(f'copy_classifier_norm=True: the classifier norm belongs to stage {last}, which '
                                  f'the model does not return (out_indices={out_indices}); add {last} to out_indices '
                                  'or leave copy_classifier_norm False')
        if not classifier and not any(k.startswith(f'norm{last}.') for k in out):
            raise CheckpointError('copy_classifier_norm=True, but the checkpoint has no classifier norm (norm.*) '
                                  f'nor an output norm norm{last}.*; leave copy_classifier_norm False')
    for k in classifier:
        v = out.pop(k)
        target = f'norm{last}.' + k[len('norm.'):]
        if copy_classifier_norm and target not in out:
            out[target] = v
        else:
            dropped.append(k)
    for k in [k for k in out if re.match(r'norm\d+\.', k)]:
        if int(re.match(r'norm(\d+)\.', k).group(1)) not in out_indices:
            dropped.append(k)
            del out[k]
    return out, dropped


def plan_load(model_sd: Mapping[str, torch.Tensor], sd: dict[str, torch.Tensor], *, optional_missing=(),
              arch_hint: str = '') -> LoadPlan:
    """Compare ``sd`` with the model's own state dict and refuse what cannot load completely.

    The rule is :func:`mmplugin.checkpoint.require_fit`'s (shared with the tools' whole-model check).

    Args:
        model_sd: ``model.state_dict()``.
        sd: converted checkpoint.
        optional_missing: key prefixes allowed to be absent (new layers such as output norms).
        arch_hint: appended to error messages (e.g. "the model is arch 'l1'").

    Raises:
        CheckpointError: a shape differs (naming key and both shapes), or weights of the network body are missing
            or left over, i.e. the checkpoint is for another arch or another model family.
    """
    require_fit(model_sd, sd, optional_prefixes=optional_missing, arch_hint=arch_hint)
    return LoadPlan({k: v for k, v in sd.items() if k in model_sd}, [k for k in model_sd if k not in sd])
