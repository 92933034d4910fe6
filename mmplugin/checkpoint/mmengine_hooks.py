"""Route mmengine's checkpoint loading and saving through :mod:`mmplugin.checkpoint` (called on ``import mmplugin``).

:func:`install_safe_checkpoint_loading` allow-lists the runner-checkpoint types, replaces mmengine's loaders for
local paths and ``http(s)://`` URLs (``load_from``, ``--resume``, ``init_cfg``, the tools) with
:func:`~mmplugin.checkpoint.load_checkpoint_file` (weights only, URLs downloaded once into the torch hub cache),
converts the backbone part of published whole-model checkpoints (official Swin repositories, mmdet / mmseg zoos)
to the layout of the plugin backbones in the model being loaded (:func:`_converting_loader`), and makes mmengine's
local file writes atomic (:func:`~mmplugin.checkpoint.atomic_write_bytes`). Weights-only loading is never switched
off.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .atomic import atomic_write_bytes
from .safe import load_checkpoint_file, safe_globals

__all__ = ['install_safe_checkpoint_loading', 'load_from_mmplugin']

_INSTALLED = False


def load_from_mmplugin(filename: str, map_location: Any = None, *args, **kwargs) -> Any:
    """mmengine ``CheckpointLoader`` scheme for local paths and ``http(s)://`` URLs."""
    return load_checkpoint_file(filename, map_location=map_location)


def _mmengine_load_url(url: str, model_dir: Any = None, map_location: Any = None, *args, **kwargs) -> Any:
    """Replaces ``mmengine.runner.checkpoint.load_url`` (``torchvision://``, ``open-mmlab://`` URLs), which
    unpickles with ``weights_only=False``."""
    return load_checkpoint_file(url, map_location=map_location)


def _converting_loader(original):
    """Wrap mmengine's ``_load_checkpoint_to_model`` (behind ``load_from``, ``--resume``, ``load_checkpoint``,
    mmdet's ``init_detector``, mmseg's ``init_model``) so that published whole-model layouts of plugin backbones are
    converted to the model's before mmengine loads them; one log line says what was converted. Checkpoints that
    already fit, and models without plugin backbones, pass through untouched."""
    def load(model, checkpoint, strict=False, logger=None, revise_keys=((r'^module\.', ''), )):
        sd = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, Mapping) else None
        if isinstance(sd, Mapping) and sd:
            from ..converters.whole_model import convert_model_state_dict
            revised = dict(sd)
            for pattern, repl in revise_keys:
                revised = {re.sub(pattern, repl, str(k)): v for k, v in revised.items()}
            conversion = convert_model_state_dict(model, revised)
            if conversion.changed:
                from mmengine.logging import print_log
                print_log(conversion.describe(), logger=logger or 'current')
                from collections import OrderedDict
                converted = OrderedDict(conversion.state_dict)
                converted._metadata = getattr(sd, '_metadata', OrderedDict())  # module versions (BatchNorm)
                checkpoint = ({**checkpoint, 'state_dict': converted} if 'state_dict' in checkpoint else converted)
                revise_keys = ()  # already applied: revising twice is not idempotent for every rule
        return original(model, checkpoint, strict, logger, revise_keys=list(revise_keys))

    load.__wrapped__ = original
    return load


def _atomic_put(self, obj: bytes, filepath) -> None:  # replaces mmengine LocalBackend.put
    atomic_write_bytes(obj, filepath)


def install_safe_checkpoint_loading(extra_globals: Iterable[Any] = ()) -> None:
    """Allow-list runner-checkpoint types, route mmengine's local and URL loading through
    :func:`load_checkpoint_file`, convert published whole-model layouts when a model is loaded, and make
    mmengine's local writes atomic. Idempotent; never sets
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``.

    Args:
        extra_globals: further types to trust (for a project's own checkpoint metadata).
    """
    global _INSTALLED
    extra = list(extra_globals)
    if extra:
        torch.serialization.add_safe_globals(extra)
    if _INSTALLED:
        return
    torch.serialization.add_safe_globals(safe_globals())
    import mmengine.runner.checkpoint as mm_ckpt
    import mmengine.runner.runner as mm_runner
    from mmengine.fileio.backends.local_backend import LocalBackend
    mm_ckpt.CheckpointLoader.register_scheme(prefixes='', loader=load_from_mmplugin, force=True)
    mm_ckpt.CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=load_from_mmplugin, force=True)
    mm_ckpt.load_url = _mmengine_load_url
    original = mm_ckpt._load_checkpoint_to_model
    mm_ckpt._load_checkpoint_to_model = _converting_loader(original)
    # modules that imported the function by name before this ran keep their own reference (mmengine's Runner and
    # BaseInferencer, mmdet's DetInferencer, mmseg's MMSegInferencer, when imported before mmplugin): rebind it
    # there too. Modules imported later read the converting one from mmengine.runner.checkpoint.
    for module in [mm_runner, *list(sys.modules.values())]:
        if getattr(module, '__dict__', {}).get('_load_checkpoint_to_model') is original:
            module._load_checkpoint_to_model = mm_ckpt._load_checkpoint_to_model
    LocalBackend.put = _atomic_put
    _INSTALLED = True
