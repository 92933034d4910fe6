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
* it converts the backbone part of published whole-model checkpoints (official Swin repositories, mmdet / mmseg
  zoos) to the layout of the plugin backbones in the model being loaded (:mod:`.mmengine_hooks`);
* it makes mmengine's local file writes atomic (temporary file in the same folder, ``fsync``, ``os.replace``,
  mode from the umask), so a run killed during a save never leaves a truncated checkpoint behind; temporary
  files of a killed save are removed at the next save or resume (:func:`remove_stale_temporary_files`).

Modules, one concern each (every public name is re-exported here):

* :mod:`.errors`: :class:`CheckpointError` and its two subclasses;
* :mod:`.sniff`: :func:`describe_file`, what a file that is not a checkpoint looks like;
* :mod:`.safe`: the allow-list and :func:`load_checkpoint_file`;
* :mod:`.download`: :func:`download_checkpoint` into the torch hub cache;
* :mod:`.atomic`: :func:`atomic_write_bytes`, locks, :func:`remove_stale_temporary_files`;
* :mod:`.fit`: "does it fit" (:func:`state_dict_mismatch`, :func:`check_checkpoint_fits`, :func:`require_fit`);
* :mod:`.mmengine_hooks`: :func:`install_safe_checkpoint_loading`.
"""
from __future__ import annotations

from .atomic import _atomic_file, _locked, atomic_write_bytes, remove_stale_temporary_files
from .download import download_checkpoint, is_url
from .errors import CheckpointError, CheckpointNotFoundError, UnsafeCheckpointError
from .fit import (check_checkpoint_fits, format_keys, is_optional_key, key_mismatch_is_structural, require_fit,
                  shape_mismatches, state_dict_mismatch, strip_module_prefix)
from .mmengine_hooks import install_safe_checkpoint_loading, load_from_mmplugin
from .safe import load_checkpoint_file, safe_globals
from .sniff import describe_file

__all__ = [
    'CheckpointError', 'CheckpointNotFoundError', 'UnsafeCheckpointError', 'safe_globals', 'load_checkpoint_file',
    'describe_file', 'is_url', 'download_checkpoint', 'atomic_write_bytes', 'remove_stale_temporary_files',
    'is_optional_key', 'format_keys', 'strip_module_prefix', 'key_mismatch_is_structural', 'shape_mismatches',
    'state_dict_mismatch', 'check_checkpoint_fits', 'require_fit', 'install_safe_checkpoint_loading',
    'load_from_mmplugin'
]
