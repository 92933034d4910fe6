"""Route mmengine's checkpoint loading and saving through :mod:`mmplugin.checkpoint` (called on ``import mmplugin``).

:func:`install_safe_checkpoint_loading` allow-lists the runner-checkpoint types, replaces mmengine's loaders for
local paths and ``http(s)://`` URLs (``load_from``, ``--resume``, ``init_cfg``, the tools) with
:func:`~mmplugin.checkpoint.load_checkpoint_file` (weights only, URLs downloaded once into the torch hub cache),
and makes mmengine's local file writes atomic (:func:`~mmplugin.checkpoint.atomic_write_bytes`). Weights-only
loading is never switched off.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from mmplugin.checkpoint.atomic import atomic_write_bytes
from mmplugin.checkpoint.safe import load_checkpoint_file, safe_globals

__all__ = ['install_safe_checkpoint_loading', 'load_from_mmplugin']

_INSTALLED = False


def load_from_mmplugin(filename: str, map_location: Any = None, *args, **kwargs) -> Any:
    """mmengine ``CheckpointLoader`` scheme for local paths and ``http(s)://`` URLs."""
    return load_checkpoint_file(filename, map_location=map_location)


def _mmengine_load_url(url: str, model_dir: Any = None, map_location: Any = None, *args, **kwargs) -> Any:
    """Replaces ``mmengine.runner.checkpoint.load_url`` (``torchvision://``, ``open-mmlab://`` URLs), which
    unpickles with ``weights_only=False``."""
    return load_checkpoint_file(url, map_location=map_location)


def _atomic_put(self, obj: bytes, filepath) -> None:  # replaces mmengine LocalBackend.put
    atomic_write_bytes(obj, filepath)


def install_safe_checkpoint_loading(extra_globals: Iterable[Any] = ()) -> None:
    """Allow-list runner-checkpoint types, route mmengine's local and URL loading through
    :func:`load_checkpoint_file` and make mmengine's local writes atomic. Idempotent; never sets
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
    from mmengine.fileio.backends.local_backend import LocalBackend
    mm_ckpt.CheckpointLoader.register_scheme(prefixes='', loader=load_from_mmplugin, force=True)
    mm_ckpt.CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=load_from_mmplugin, force=True)
    mm_ckpt.load_url = _mmengine_load_url
    LocalBackend.put = _atomic_put
    _INSTALLED = True
