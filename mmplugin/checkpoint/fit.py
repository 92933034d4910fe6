"""Does one state dict fit another: the one rule, key by key and shape by shape, shared by the converters
(:func:`mmplugin.checkpoint.convert.plan_load`) and the whole-model fit check (:mod:`mmplugin.loading.fit`). Plain
dicts only: nothing here knows a model class.

* :func:`state_dict_mismatch`: the missing / unexpected / reshaped keys (BatchNorm counters optional);
* :func:`require_fit`: a converted backbone state dict against a backbone; raises a :class:`CheckpointError` that
  says whether another arch or an incomplete file is the likely cause.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from mmplugin.checkpoint.errors import CheckpointError

__all__ = ['is_optional_key', 'format_keys', 'strip_module_prefix', 'key_mismatch_is_structural', 'shape_mismatches',
           'state_dict_mismatch', 'require_fit']


def is_optional_key(key: str) -> bool:
    """Keys a checkpoint may lack: BatchNorm's ``num_batches_tracked`` counters (only used with ``momentum=None``).

    PyTorch's own strict ``load_state_dict`` accepts a state dict without them when the dict carries no version
    metadata (plain dicts, and the plans this plugin loads): ``_NormBase._load_from_state_dict`` then fills the
    absent counter with the module's current value (0 for a new model; older torch versions always used 0).
    Loading through the plugin leaves the counters exactly as that load would.
    """
    return key.endswith('num_batches_tracked')


def _indexed_prefixes(key: str) -> list[str]:
    """``'stages.1.blocks.2.attn.w'`` -> ``['stages.1', 'stages.1.blocks.2']``: the numbered containers a key is in."""
    parts = key.split('.')
    return ['.'.join(parts[:i + 1]) for i, p in enumerate(parts[:-1]) if p.isdigit()]


def key_mismatch_is_structural(missing: Iterable[str], unexpected: Iterable[str], model_keys: Iterable[str],
                               ckpt_keys: Iterable[str]) -> bool:
    """Whether every missing / unexpected key belongs to a numbered block or stage that exists on one side only.

    That is what another depth or number of stages (another arch) produces; a missing key inside a block that the
    checkpoint does have means an incomplete checkpoint or another version of the code, not another arch.
    """
    def containers(keys):
        return {p for k in keys for p in _indexed_prefixes(k)}

    in_ckpt, in_model = containers(ckpt_keys), containers(model_keys)
    missing, unexpected = list(missing), list(unexpected)
    if not missing and not unexpected:
        return False
    return (all(any(p not in in_ckpt for p in _indexed_prefixes(k)) for k in missing)
            and all(any(p not in in_model for p in _indexed_prefixes(k)) for k in unexpected))


def format_keys(keys: list[str], n: int = 5) -> str:
    """The first ``n`` keys, comma-separated, and how many more there are."""
    return ', '.join(keys[:n]) + (f', ... (+{len(keys) - n} more)' if len(keys) > n else '')


def strip_module_prefix(sd: Mapping[Any, Any]) -> dict[str, Any]:
    """``sd`` with every leading ``module.`` removed from each key (``DataParallel`` / DDP wrappers, also nested
    ones: ``module.module.x`` -> ``x``); keys become strings, the values are the same objects."""
    out = {}
    for k, v in sd.items():
        k = str(k)
        while k.startswith('module.'):
            k = k[len('module.'):]
        out[k] = v
    return out


def shape_mismatches(sd: Mapping[str, Any], model_sd: Mapping[str, torch.Tensor]
                     ) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """``(key, checkpoint shape, model shape)`` for every tensor of ``sd`` whose shape differs from the model's,
    in the model's key order."""
    return [(k, tuple(sd[k].shape), tuple(v.shape)) for k, v in model_sd.items()
            if k in sd and isinstance(sd[k], torch.Tensor) and sd[k].shape != v.shape]


def state_dict_mismatch(sd: Mapping[str, Any], model_sd: Mapping[str, torch.Tensor], *,
                        optional_prefixes: Iterable[str] = ()) -> tuple[list[str], list[str], list[str]]:
    """What keeps ``sd`` from loading strictly into a module whose ``state_dict()`` is ``model_sd``: the rule of
    "does it fit", shared by :func:`require_fit` and the whole-model fit check (:mod:`mmplugin.loading.fit`).

    Args:
        sd: the checkpoint's state dict (keys as the module names them).
        model_sd: the module's ``state_dict()``.
        optional_prefixes: key prefixes of the module that may stay as initialised (new layers such as output
            norms); BatchNorm counters are always optional (:func:`is_optional_key`).

    Returns:
        ``(missing, unexpected, shapes)``: the model's keys ``sd`` lacks, the keys of ``sd`` the model lacks, and
        ``'key (checkpoint shape) vs (model shape)'`` for every tensor of another shape. All empty: it fits.
    """
    optional = tuple(optional_prefixes)
    missing = [k for k in model_sd if k not in sd and not is_optional_key(k) and not k.startswith(optional)]
    unexpected = [k for k in sd if k not in model_sd]
    shapes = [f'{k} {got} vs {want}' for k, got, want in shape_mismatches(sd, model_sd)]
    return missing, unexpected, shapes


def require_fit(model_sd: Mapping[str, torch.Tensor], sd: Mapping[str, Any], *, optional_prefixes: Iterable[str] = (),
                arch_hint: str = '') -> None:
    """Refuse a (converted) state dict that cannot load completely into a module whose ``state_dict()`` is
    ``model_sd``; returns ``None`` when it fits (keys under ``optional_prefixes`` and BatchNorm counters may be
    absent).

    Raises:
        CheckpointError: a shape differs (naming key and both shapes), no weight of the module is in ``sd``
            (another family or layout), or weights are missing or left over; the message says whether whole
            blocks or stages differ (another arch) or not (an incomplete file, another version of the code).
            ``arch_hint`` (e.g. "the model is arch 'l1'") is added to the messages.
    """
    hint = f' ({arch_hint})' if arch_hint else ''
    optional = tuple(optional_prefixes)
    bad = shape_mismatches(sd, model_sd)
    if bad:
        k, got, want = bad[0]
        more = f' and {len(bad) - 1} more' if len(bad) > 1 else ''
        raise CheckpointError(f'shape mismatch for {k!r}: checkpoint {got} vs model {want}{more}. The checkpoint is '
                              f'most likely for another arch or window size{hint}.')
    missing, unexpected, _ = state_dict_mismatch(sd, model_sd, optional_prefixes=optional)
    required = [k for k in model_sd if not k.startswith(optional) and not is_optional_key(k)]
    if missing and len(missing) == len(required):
        raise CheckpointError(f'none of the model\'s weights are in the checkpoint{hint}; it is for another model '
                              f'family or layout (first keys: {list(sd)[:5]})')
    if not (missing or unexpected):
        return
    parts = []
    if missing:
        parts.append(f'missing {len(missing)} ({format_keys(missing, 12)})')
    if unexpected:
        parts.append(f'unexpected {len(unexpected)} ({format_keys(unexpected, 12)})')
    if key_mismatch_is_structural(missing, unexpected, model_sd, sd):
        raise CheckpointError('the checkpoint does not fit the model: ' + '; '.join(parts) +
                              f'. Whole blocks or stages differ: it is for another arch{hint}; nothing was loaded.')
    raise CheckpointError('the checkpoint does not fit the model: ' + '; '.join(parts) + '. The blocks and shapes '
                          'agree, so it is incomplete or from another version of the code, not another '
                          f'arch{hint}; nothing was loaded.')
