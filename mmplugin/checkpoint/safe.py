"""Weights-only loading of untrusted checkpoint files (local paths and URLs) with errors that say what is wrong.

``torch.load`` runs with ``weights_only=True`` always (also on torch < 2.6, where the default was ``False``). The
allow-list (:func:`safe_globals`) holds exactly the non-tensor types mmengine 0.10.7's runner checkpoints carry
(``HistoryBuffer`` in the message hub, numpy arrays and dtypes inside it, ``ConfigDict`` in metadata). Nothing in a
refused file is executed: the weights-only unpickler never calls a global that is not allow-listed.
"""
from __future__ import annotations

import os
import os.path as osp
import pickle
import re
from typing import Any

import torch

from mmplugin.checkpoint.download import download_checkpoint, is_url
from mmplugin.checkpoint.errors import CheckpointError, CheckpointNotFoundError, UnsafeCheckpointError
from mmplugin.checkpoint.sniff import _REDOWNLOAD, describe_file

__all__ = ['safe_globals', 'load_checkpoint_file']


_HISTORY_STATISTICS = frozenset({'min', 'max', 'mean', 'current'})


def _statistics_getattr(obj: Any, name: str) -> Any:
    """Stand-in for ``builtins.getattr`` during weights-only loading.

    mmengine pickles ``HistoryBuffer``'s statistics methods as ``getattr(HistoryBuffer, 'min')``, and a sharded FSDP
    checkpoint its ShardedTensors' ``getattr(ShardedTensor, 'ProcessGroupState')`` record; this resolves exactly
    those lookups and refuses every other ``getattr`` a checkpoint asks for.
    """
    from mmengine.logging import HistoryBuffer
    allowed = _HISTORY_STATISTICS | set(getattr(HistoryBuffer, '_statistics_methods', {}))
    if obj is HistoryBuffer and isinstance(name, str) and name in allowed:
        return getattr(obj, name)
    if name == 'ProcessGroupState' and getattr(obj, '__qualname__', None) == 'ShardedTensor' \
            and getattr(obj, '__module__', '').startswith('torch.distributed.'):
        return obj.ProcessGroupState
    raise pickle.UnpicklingError(f'Unsupported global: GLOBAL builtins.getattr on {obj!r}, {name!r}')


def safe_globals() -> list:
    """The non-tensor types that mmengine runner checkpoints legitimately contain.

    Returns:
        list: classes and functions to pass to :func:`torch.serialization.add_safe_globals`.
    """
    import numpy as np
    from mmengine.config import ConfigDict
    from mmengine.logging import HistoryBuffer

    allowed: list[Any] = [HistoryBuffer, ConfigDict, np.ndarray, np.dtype,
                          (_statistics_getattr, 'builtins.getattr'), (_statistics_getattr, '__builtin__.getattr')]
    # numpy >= 2 moved the pickling helpers to numpy._core; numpy 1.x has them in numpy.core.
    for mod_name in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        try:
            mod = __import__(mod_name, fromlist=['_reconstruct', 'scalar'])
        except ImportError:
            continue
        allowed += [mod._reconstruct, mod.scalar]
    # Concrete dtype classes (numpy >= 1.25) are pickled by type, e.g. numpy.dtypes.Float64DType.
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        allowed += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    allowed += _sharded_tensor_types()
    return allowed


def _sharded_tensor_types() -> list:
    """The types a sharded FSDP checkpoint (``iter_N.pth/rank<i>.pth``: ShardedTensors of the parameters and
    AdamW moments) pickles: torch's own shard metadata records (offsets, sizes, placement strings, a memory-format
    enum), nothing that runs code of the file's choosing. Empty where torch has no distributed package."""
    try:
        from torch.distributed._shard.metadata import ShardMetadata
        from torch.distributed._shard.sharded_tensor.api import ShardedTensor
        from torch.distributed._shard.sharded_tensor.metadata import (
            MEM_FORMAT_ENCODING,
            ShardedTensorMetadata,
            TensorProperties,
        )
        from torch.distributed._shard.sharded_tensor.shard import Shard
        from torch.distributed._shard.sharding_spec.chunk_sharding_spec import ChunkShardingSpec
        from torch.distributed.remote_device import _remote_device
    except ImportError:
        return []
    return [ShardedTensor, ShardedTensor.ProcessGroupState, Shard, ShardMetadata, ShardedTensorMetadata,
            TensorProperties, MEM_FORMAT_ENCODING, ChunkShardingSpec, _remote_device]


_GLOBAL_RE = re.compile(r'GLOBAL ([\w.]+)')
_UNSAFE_MARKERS = ('Unsupported global', 'GLOBAL', 'allowlisted', 'is blocked', 'Unsupported class')


def _unsafe_globals(path: str, err: Exception) -> list[str]:
    """Name the globals that made the weights-only unpickler refuse ``path`` (without running them)."""
    names: list[str] = []
    get_unsafe = getattr(torch.serialization, 'get_unsafe_globals_in_checkpoint', None)
    if get_unsafe is not None:
        try:
            allowed = {g[1] if isinstance(g, tuple) else f'{g.__module__}.{g.__qualname__}' for g in safe_globals()}
            names = [n for n in get_unsafe(path) if n not in allowed]
        except Exception:  # legacy (non-zip) files cannot be scanned; fall back to the message
            names = []
    if not names:
        names = _GLOBAL_RE.findall(str(err))
    return names or ['<unknown>']


def _torch_reason(err: BaseException) -> str:
    """A one-line reason from a torch error, without torch's advice to load with ``weights_only=False``."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    useful = [ln for ln in lines if 'weights_only' not in ln and 'weights only' not in ln.lower()]
    return (useful[0] if useful else type(err).__name__)[:200]


# ---------------------------------------------------------------------------------------------- loading
def load_checkpoint_file(path: str | os.PathLike, map_location: Any = 'cpu') -> Any:
    """Load a checkpoint with weights-only semantics and clear errors.

    Args:
        path: local file path or ``http(s)://`` URL (downloaded once, see :func:`download_checkpoint`).
        map_location: as in :func:`torch.load`. Defaults to ``'cpu'``.

    Returns:
        Whatever the file holds (usually a dict), built only from tensors, containers, numbers, strings and the
        types in :func:`safe_globals`.

    Raises:
        CheckpointNotFoundError: the file or URL does not exist (also a ``FileNotFoundError``).
        UnsafeCheckpointError: the file carries other pickled objects (named in the message).
        CheckpointError: anything else; the message says what the file looks like and what to do.
    """
    name = os.fspath(path)
    if is_url(name):
        path = download_checkpoint(name)
    else:
        path = osp.expanduser(name)
        if not osp.isfile(path):
            raise CheckpointNotFoundError(f'checkpoint file not found: {path!r}')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001  every failure becomes a CheckpointError below
        failure = err
    where = name if is_url(name) else path
    try:
        looks = describe_file(path)
    except OSError as err:  # e.g. no read permission
        raise CheckpointError(f'cannot read {where!r}: {err.strerror or err}; check its permissions') from None
    if looks is not None:
        raise CheckpointError(
            f'{where!r} is not a readable PyTorch checkpoint: it is {looks[0]}. To fix: {looks[1]}.') from None
    msg = str(failure)
    if isinstance(failure, pickle.UnpicklingError) and any(t in msg for t in _UNSAFE_MARKERS):
        names = _unsafe_globals(path, failure)
        raise UnsafeCheckpointError(
            f'refused to load {where!r}: it contains pickled objects that are not weights '
            f'({", ".join(names)}). Nothing in the file was executed. If you trust this file, re-save its '
            f'tensors as a plain state dict (torch.save(model.state_dict(), ...)).') from None
    raise CheckpointError(f'{where!r} is not a readable PyTorch checkpoint ({_torch_reason(failure)}). '
                          f'The file may be truncated or corrupt: {_REDOWNLOAD}.') from None
