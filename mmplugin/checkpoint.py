"""Safe checkpoint I/O: weights-only loading that still reads mmengine runner checkpoints, and atomic saving.

Checkpoints are untrusted files. Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses
every pickled global that is not allow-listed; mmengine 0.10.7's runner checkpoints carry a few such globals
(``HistoryBuffer`` in the message hub, numpy arrays and dtypes inside it, ``ConfigDict`` in metadata), so
``--resume`` and ``tools/test.py`` fail with ``UnpicklingError``.

:func:`install_safe_checkpoint_loading` (called on ``import mmplugin``) fixes that without ever switching
weights-only off:

* it allow-lists exactly those types with :func:`torch.serialization.add_safe_globals`;
* it replaces mmengine's loader for local paths with :func:`load_checkpoint_file`, which always passes
  ``weights_only=True`` (also on torch < 2.6, where the default was ``False``) and turns a refusal into
  :class:`UnsafeCheckpointError` naming the offending globals. Nothing in a refused file is executed: the
  weights-only unpickler never calls a global that is not allow-listed;
* it makes mmengine's local file writes atomic (temporary file in the same folder, ``fsync``, ``os.replace``), so
  a training run killed during a save never leaves a truncated checkpoint behind.
"""
from __future__ import annotations

import os
import os.path as osp
import pickle
import re
import tempfile
from typing import Any, Iterable

import torch

__all__ = [
    'CheckpointError', 'UnsafeCheckpointError', 'safe_globals', 'load_checkpoint_file', 'atomic_write_bytes',
    'install_safe_checkpoint_loading'
]


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or does not fit the model."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint carries pickled objects outside the allow-list; it was refused and nothing in it ran."""


_HISTORY_STATISTICS = frozenset({'min', 'max', 'mean', 'current'})


def _statistics_getattr(obj: Any, name: str) -> Any:
    """Stand-in for ``builtins.getattr`` during weights-only loading.

    mmengine pickles ``HistoryBuffer``'s statistics methods as ``getattr(HistoryBuffer, 'min')``; this resolves
    exactly those lookups and refuses every other ``getattr`` a checkpoint asks for.
    """
    from mmengine.logging import HistoryBuffer
    allowed = _HISTORY_STATISTICS | set(getattr(HistoryBuffer, '_statistics_methods', {}))
    if obj is HistoryBuffer and isinstance(name, str) and name in allowed:
        return getattr(obj, name)
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
    return allowed


_GLOBAL_RE = re.compile(r'GLOBAL ([\w.]+)')


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


def load_checkpoint_file(path: str | os.PathLike, map_location: Any = 'cpu') -> Any:
    """Load a checkpoint with weights-only semantics and clear errors.

    Args:
        path: local file path.
        map_location: as in :func:`torch.load`. Defaults to ``'cpu'``.

    Returns:
        Whatever the file holds (usually a dict), built only from tensors, containers, numbers, strings and the
        types in :func:`safe_globals`.

    Raises:
        FileNotFoundError: the file does not exist.
        UnsafeCheckpointError: the file carries other pickled objects (named in the message).
        CheckpointError: the file is not a readable PyTorch checkpoint (truncated, corrupt, another format).
    """
    path = osp.expanduser(os.fspath(path))
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path!r}')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        msg = str(err)
        if any(t in msg for t in ('Unsupported global', 'GLOBAL', 'allowlisted', 'is blocked', 'Unsupported class')):
            names = _unsafe_globals(path, err)
            raise UnsafeCheckpointError(
                f'refused to load {path!r}: it contains pickled objects that are not weights '
                f'({", ".join(names)}). Nothing in the file was executed. If you trust this file, re-save its '
                f'tensors as a plain state dict (torch.save(model.state_dict(), ...)).') from None
        raise CheckpointError(f'{path!r} is not a readable PyTorch checkpoint ({msg.splitlines()[0]}). '
                              'The file may be truncated or corrupt: download or copy it again.') from None
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f'{path!r} is not a readable PyTorch checkpoint ({first}). '
                              'The file may be truncated or corrupt: download or copy it again.') from None


def atomic_write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one.

    The bytes go to a temporary file in the same folder (same filesystem), are flushed to disk, and the file is
    renamed over ``path`` with :func:`os.replace`, which is atomic on POSIX and Windows.
    """
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + osp.basename(path) + '.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.unlink(tmp)
        raise


_INSTALLED = False


def _mmengine_local_loader(filename: str, map_location: Any = None) -> Any:
    return load_checkpoint_file(filename, map_location=map_location)


def _atomic_put(self, obj: bytes, filepath) -> None:  # replaces mmengine LocalBackend.put
    atomic_write_bytes(obj, filepath)


def install_safe_checkpoint_loading(extra_globals: Iterable[Any] = ()) -> None:
    """Allow-list runner-checkpoint types, route mmengine's local loading through :func:`load_checkpoint_file`
    and make mmengine's local writes atomic. Idempotent; never sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``.

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
    from mmengine.fileio.backends.local_backend import LocalBackend
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=_mmengine_local_loader, force=True)
    LocalBackend.put = _atomic_put
    _INSTALLED = True
