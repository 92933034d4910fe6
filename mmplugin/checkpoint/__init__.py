"""Safe checkpoint I/O: weights-only loading (local files and URLs) with clear errors, and atomic saving.

Checkpoints are untrusted files. Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses
every pickled global that is not allow-listed; mmengine 0.10.7's runner checkpoints carry a few such globals
(``HistoryBuffer`` in the message hub, numpy arrays and dtypes inside it, ``ConfigDict`` in metadata), so
``--resume`` and ``tools/test.py`` fail with ``UnpicklingError``.

:func:`install_safe_checkpoint_loading` (called on ``import mmplugin``) fixes that without ever switching
weights-only off:

* it allow-lists exactly those types with :func:`torch.serialization.add_safe_globals`;
* it replaces mmengine's loaders for local paths and ``http(s)://`` URLs (``load_from``, ``--resume``,
  ``init_cfg``, the tools) with :func:`load_checkpoint_file`, which always passes ``weights_only=True`` (also on
  torch < 2.6, where the default was ``False``). URLs are downloaded once into the torch hub cache
  (:func:`download_checkpoint`) instead of going through ``torch.hub.load_state_dict_from_url``, which mmengine
  calls with ``weights_only=False``;
* every failure is a :class:`CheckpointError` that says what the file looks like (empty, text, HTML page, Git LFS
  pointer, truncated zip, pickle with forbidden globals, ...) and what to do. Nothing in a refused file is
  executed: the weights-only unpickler never calls a global that is not allow-listed;
* it makes mmengine's local file writes atomic (temporary file in the same folder, ``fsync``, ``os.replace``,
  mode from the umask), so a run killed during a save never leaves a truncated checkpoint behind; temporary
  files of a killed save are removed at the next save or resume (:func:`remove_stale_temporary_files`).

Modules, one concern each (every public name is re-exported here):

* :mod:`.errors`: :class:`CheckpointError` and its two subclasses;
* :mod:`.sniff`: :func:`describe_file`, what a file that is not a checkpoint looks like;
* :mod:`.safe`: the allow-list and :func:`load_checkpoint_file`;
* :mod:`.download`: :func:`download_checkpoint` into the torch hub cache;
* :mod:`.atomic`: :func:`atomic_write_bytes`, locks, :func:`remove_stale_temporary_files`;
* :mod:`.fit`: does one state dict fit another (:func:`state_dict_mismatch`, :func:`require_fit`);
* :mod:`.convert`: pure key operations the family converters share (unwrap containers, strip prefixes, plan a load);
* :mod:`.mmengine_hooks`: :func:`install_safe_checkpoint_loading`.

Everything here works on files and plain dicts and imports nothing of the package above it. Loading that knows the
model (converting published whole-model layouts, "does this file fit this detector", the converting loader inside
mmengine) is :mod:`mmplugin.loading`.
"""
from __future__ import annotations

from mmplugin.checkpoint.atomic import atomic_write_bytes, remove_stale_temporary_files
from mmplugin.checkpoint.download import download_checkpoint, is_url
from mmplugin.checkpoint.errors import CheckpointError, CheckpointNotFoundError, UnsafeCheckpointError
from mmplugin.checkpoint.fit import (
    format_keys,
    is_optional_key,
    key_mismatch_is_structural,
    require_fit,
    shape_mismatches,
    state_dict_mismatch,
    strip_module_prefix,
)
from mmplugin.checkpoint.mmengine_hooks import install_safe_checkpoint_loading, load_from_mmplugin
from mmplugin.checkpoint.safe import load_checkpoint_file, safe_globals
from mmplugin.checkpoint.sniff import describe_file

__all__ = [
    'CheckpointError', 'CheckpointNotFoundError', 'UnsafeCheckpointError', 'safe_globals', 'load_checkpoint_file',
    'describe_file', 'is_url', 'download_checkpoint', 'atomic_write_bytes', 'remove_stale_temporary_files',
    'is_optional_key', 'format_keys', 'strip_module_prefix', 'key_mismatch_is_structural', 'shape_mismatches',
    'state_dict_mismatch', 'require_fit', 'install_safe_checkpoint_loading',
    'load_from_mmplugin'
]
