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
  zoos) to the layout of the plugin backbones in the model being loaded (:func:`_converting_loader`);
* it makes mmengine's local file writes atomic (temporary file in the same folder, ``fsync``, ``os.replace``,
  mode from the umask), so a run killed during a save never leaves a truncated checkpoint behind; temporary
  files of a killed save are removed at the next save or resume (:func:`remove_stale_temporary_files`).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import os.path as osp
import pickle
import re
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping
from typing import Any

import torch

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; stale files are then only removed at resume
    fcntl = None

__all__ = [
    'CheckpointError', 'CheckpointNotFoundError', 'UnsafeCheckpointError', 'safe_globals', 'load_checkpoint_file',
    'describe_file', 'is_url', 'download_checkpoint', 'atomic_write_bytes', 'remove_stale_temporary_files',
    'is_optional_key', 'format_keys', 'key_mismatch_is_structural', 'state_dict_mismatch', 'check_checkpoint_fits',
    'install_safe_checkpoint_loading'
]


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or does not fit the model."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file or URL does not exist (also a :class:`FileNotFoundError`, for existing callers)."""


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


# ---------------------------------------------------------------------------------------------- what is this file
_REDOWNLOAD = 'download or copy it again (and compare its size or sha256 with the source)'


def describe_file(path: str | os.PathLike) -> tuple[str, str] | None:
    """Say what a file that cannot be a PyTorch checkpoint looks like, from its first bytes and its size.

    Returns:
        ``(looks_like, what_to_do)``, two sentence fragments for an error message, or ``None`` when the file
        starts like one of torch's formats (a zip archive whose central directory reads, or a pickle).
    """
    path = os.fspath(path)
    size = osp.getsize(path)
    if size == 0:
        return 'empty (0 bytes)', f'an interrupted download or copy leaves such files: {_REDOWNLOAD}'
    with open(path, 'rb') as f:
        head = f.read(4096)
    text = head.lstrip(b'\xef\xbb\xbf \t\r\n')
    if text.startswith(b'version https://git-lfs'):
        m = re.search(rb'size (\d+)', head)
        real = f' for a {int(m.group(1)):,}-byte file' if m else ''
        return (f'a Git LFS pointer ({size} bytes of text standing in{real}), not the weights',
                'fetch the real file with `git lfs install && git lfs pull` in the repository it came from, or '
                "download it through the hosting site's raw-file link")
    if head[:4] == b'PK\x03\x04':
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            return (f'a truncated or corrupt zip archive ({size:,} bytes; {err})',
                    f'the end of the file is missing or damaged: {_REDOWNLOAD}')
        if not any(n.endswith('data.pkl') for n in names):
            return (f'a zip archive but not a PyTorch checkpoint (it holds {names[:3]})',
                    'unzip it and point to the checkpoint inside')
        if bad is not None:
            return f'a corrupt checkpoint archive (CRC error in {bad!r})', _REDOWNLOAD
        return None
    if head[:1] == b'\x80':  # pickle protocol >= 2: torch's legacy format
        return None
    if head[:2] == b'\x1f\x8b':
        return 'a gzip-compressed file', 'decompress it (tar -xzf or gunzip) and point to the .pth inside'
    if len(head) > 262 and head[257:262] == b'ustar':
        return 'a tar archive', 'extract it (tar -xf) and point to the .pth inside'
    if len(head) >= 10 and head[8:10] in (b'{"', b"{'") and int.from_bytes(head[:8], 'little') < size:
        return ('a safetensors file', 'convert it once: '
                "torch.save(safetensors.torch.load_file(PATH), 'weights.pth'), and point to weights.pth")
    low = text[:1024].lower()
    if low.startswith((b'<!doctype html', b'<html', b'<head', b'<?xml')) or b'<html' in low:
        m = re.search(rb'<title[^>]*>(.*?)</title>', head, re.I | re.S)
        title = f' titled {m.group(1).decode("utf-8", "replace").strip()[:80]!r}' if m else ''
        if b'google' in head.lower():
            why = ('Google Drive (where the SwiftFormer weights are hosted) answers large-file links with a '
                   'virus-scan confirmation page; ')
        else:
            why = 'the server answered with a web page (login, error or confirmation page) instead of the file; '
        return (f'an HTML page{title} ({size:,} bytes), not a checkpoint',
                why + 'open the link in a browser, confirm the download, and point to the downloaded file')
    try:
        sample = head.decode('utf-8')
    except UnicodeDecodeError as err:  # a multi-byte character cut by the 4096-byte read is still text
        sample = head[:err.start].decode('utf-8') if len(head) == 4096 and err.start >= 4093 else None
    if sample is not None and all(c.isprintable() or c in '\t\r\n\f' for c in sample):
        first = sample.strip().splitlines()[0][:60] if sample.strip() else ''
        return (f'a text file ({size:,} bytes, starting {first!r}), not a checkpoint',
                'check the path: checkpoints are binary files written by torch.save')
    return (f'not a PyTorch checkpoint (binary data starting with {head[:8].hex(" ")})',
            'check the path, or the tool that wrote this file')


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


# ---------------------------------------------------------------------------------------------- URLs
_URL_RE = re.compile(r'^https?://', re.I)
# torch.hub's convention: a file named NAME-<first hex digits of its sha256>.EXT. A suffix of digits only is more
# likely a date (…_20220317.pth) than a hash, so it is not checked.
_HASH_SUFFIX_RE = re.compile(r'-([0-9a-f]{8,64})\.[A-Za-z0-9]+$')


def is_url(path: Any) -> bool:
    """Whether ``path`` is an ``http://`` or ``https://`` address."""
    return isinstance(path, str) and _URL_RE.match(path) is not None


def _cache_name(url: str) -> str:
    """File name in the cache: the URL's own, made unique when the URL has none (``uc?id=...``)."""
    from urllib.parse import unquote, urlparse
    parts = urlparse(url)
    base = osp.basename(unquote(parts.path)) or 'checkpoint'
    stem, ext = osp.splitext(base)
    if parts.query or not ext:
        tag = hashlib.sha256(url.encode()).hexdigest()[:12]
        return f'{stem}_url{tag}{ext or ".pth"}'
    return base


class _Progress:
    """A progress bar on stderr: tqdm when installed, else one updated line."""

    def __init__(self, total: int | None, name: str, enabled: bool):
        self.total, self.name, self.enabled, self.done, self._bar, self._last = total, name, enabled, 0, None, 0.0
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, unit='B', unit_scale=True, unit_divisor=1024, desc=name)
            except ImportError:
                pass

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
        elif time.monotonic() - self._last > 0.5:
            self._last = time.monotonic()
            pct = f' {100 * self.done / self.total:5.1f}%' if self.total else ''
            sys.stderr.write(f'\rdownloading {self.name}: {self.done / 2**20:.1f} MiB{pct}')
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write('\n')


def download_checkpoint(url: str, *, progress: bool | None = None, timeout: float = 60.0) -> str:
    """Download ``url`` once into ``<torch.hub.get_dir()>/checkpoints`` and return the local path.

    The bytes go to a temporary file that becomes the cached file only when the download is complete (the
    announced ``Content-Length`` arrived), looks like a PyTorch checkpoint (not an HTML or text page), and, when
    the file name ends in ``-<hex>`` (torch.hub's convention), its sha256 starts with that hex. A failed or
    interrupted download never leaves a file behind. Processes of one machine that ask at the same time download
    once (file lock); the others reuse the result.

    Args:
        url: ``http://`` or ``https://`` address.
        progress: show a progress bar on stderr; default: when stderr is a terminal.
        timeout: seconds to wait for the connection and for each read.

    Raises:
        CheckpointNotFoundError: HTTP 404 or 410.
        CheckpointError: any other failure, with what happened and what to do.
    """
    folder = osp.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(folder, exist_ok=True)
    dst = osp.join(folder, _cache_name(url))
    with _locked(osp.join(folder, f'.{osp.basename(dst)}.lock')):
        if not osp.isfile(dst):
            _download(url, dst, sys.stderr.isatty() if progress is None else progress, timeout)
    return dst


def _download(url: str, dst: str, progress: bool, timeout: float) -> None:
    import urllib.error
    import urllib.request
    offline = ('download it elsewhere and pass the local path instead of the URL')
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers={'User-Agent': 'mmplugin'}),
                                      timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code in (404, 410):
            raise CheckpointNotFoundError(f'checkpoint URL not found (HTTP {err.code}): {url}; check the address '
                                          '(README, "Official weights")') from None
        raise CheckpointError(f'downloading {url} failed: HTTP {err.code} {err.reason}; try again later, or '
                              f'{offline}') from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, 'reason', err)
        raise CheckpointError(f'cannot download {url} ({reason}); check the address and the network, or '
                              f'{offline}') from None
    m = _HASH_SUFFIX_RE.search(osp.basename(dst))
    hash_prefix = m.group(1) if m and re.search('[a-f]', m.group(1)) else None
    length = resp.headers.get('Content-Length')
    total = int(length) if length and length.isdigit() else None
    bar = _Progress(total, osp.basename(dst), progress)
    sha = hashlib.sha256()
    try:
        with resp, _atomic_file(dst) as (f, tmp):
            try:
                while True:
                    chunk = resp.read(1 << 20)
                    if not chunk:
                        break
                    f.write(chunk)
                    sha.update(chunk)
                    bar.update(len(chunk))
            except (OSError, ValueError, EOFError) as err:  # http.client.IncompleteRead, reset, timeout
                raise CheckpointError(f'the download of {url} was interrupted after {bar.done:,} bytes '
                                      f'({type(err).__name__}); nothing was cached: run again') from None
            if total is not None and bar.done != total:
                raise CheckpointError(f'the download of {url} was truncated: {bar.done:,} of {total:,} bytes '
                                      'arrived; nothing was cached: run again')
            f.flush()
            looks = describe_file(tmp)
            if looks is not None:
                raise CheckpointError(f'{url} did not return a checkpoint: the server sent {looks[0]}; nothing was '
                                      f'cached. To fix: {looks[1]}.')
            if hash_prefix and not sha.hexdigest().startswith(hash_prefix):
                raise CheckpointError(f'the download of {url} is corrupt: its sha256 starts with '
                                      f'{sha.hexdigest()[:len(hash_prefix)]}, the file name says {hash_prefix}; '
                                      'nothing was cached: run again')
    finally:
        bar.close()


# ---------------------------------------------------------------------------------------------- atomic writes
# Temporary files are named like tempfile.mkstemp(prefix='.' + name + '.', suffix='.tmp'): '.iter_8.pth.k3j_x9a1.tmp'.
_TMP_RE = re.compile(r'^\..+\.[a-z0-9_]{8}\.tmp$')
_STALE_AFTER_S = 60.0  # at a save, a lock-free temporary file younger than this may be just being created


def _current_umask() -> int:
    try:
        with open('/proc/self/status') as f:  # Linux >= 4.7: read without changing it (thread-safe)
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _locked(path: str):
    """Hold an exclusive advisory lock on ``path`` (created if needed); a no-op where locks are unavailable."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_file(path: str):
    """Yield ``(file, tmp_path)`` for writing; on success the file replaces ``path`` atomically.

    The temporary file lives in the same folder (same filesystem), gets the mode a plain ``open()`` would give
    (``0o666`` minus the umask; ``mkstemp`` alone gives ``0o600``), and is locked while being written, so that
    :func:`remove_stale_temporary_files` can tell a live write from one whose process was killed. It is renamed
    while still open and locked; on any error it is removed.
    """
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + osp.basename(path) + '.', suffix='.tmp', dir=folder)
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mode = 0o666 & ~_current_umask()
        if hasattr(os, 'fchmod'):
            os.fchmod(fd, mode)
        else:
            os.chmod(tmp, mode)
        with os.fdopen(fd, 'wb') as f:
            fd = -1
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_stale_temporary_files(folder: str | os.PathLike, *, at_resume: bool = False) -> list[str]:
    """Delete the temporary files that saves killed mid-write left in ``folder``.

    A file is stale when no process holds its lock (writers hold it until the rename). At a save (the default)
    files younger than a minute are kept, since one may be just being created. ``at_resume=True`` (the run that
    wrote them is over) drops the age limit and also removes files on filesystems without locks.

    Returns:
        The names of the removed files.
    """
    folder = os.fspath(folder)
    removed = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not _TMP_RE.match(name):
            continue
        path = osp.join(folder, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not at_resume and now - st.st_mtime < _STALE_AFTER_S:
                continue
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live writer
                except OSError:
                    if not at_resume:
                        continue  # no locks on this filesystem: only the resume may be sure
            if os.stat(path).st_ino == st.st_ino:  # not renamed to its target meanwhile
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def atomic_write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one.

    The bytes go to a temporary file in the same folder (same filesystem), are flushed to disk, and the file is
    renamed over ``path`` with :func:`os.replace`, which is atomic on POSIX and Windows. The new file's mode
    follows the umask, as with ``open()``. Temporary files of earlier saves that were killed are removed first.
    """
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    if osp.isdir(folder):
        removed = remove_stale_temporary_files(folder)
        if removed:
            from mmengine.logging import print_log
            print_log(f'removed {len(removed)} temporary file(s) of interrupted saves in {folder}: '
                      f'{", ".join(removed)}', logger='current')
    with _atomic_file(path) as (f, _):
        f.write(data)


# ---------------------------------------------------------------------------------------------- does it fit
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


def state_dict_mismatch(sd: Mapping[str, Any], model_sd: Mapping[str, torch.Tensor]
                        ) -> tuple[list[str], list[str], list[str]]:
    """What keeps ``sd`` from loading strictly into a module whose ``state_dict()`` is ``model_sd``: the rule of
    "does it fit", shared by :func:`check_checkpoint_fits` and the whole-model converter.

    Returns:
        ``(missing, unexpected, shapes)``: the model's keys ``sd`` lacks (BatchNorm counters optional, see
        :func:`is_optional_key`), the keys of ``sd`` the model lacks, and ``'key (checkpoint shape) vs (model
        shape)'`` for every tensor of another shape. All empty: it fits.
    """
    missing = [k for k in model_sd if k not in sd and not is_optional_key(k)]
    unexpected = [k for k in sd if k not in model_sd]
    shapes = [f'{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}' for k, v in model_sd.items()
              if k in sd and isinstance(sd[k], torch.Tensor) and sd[k].shape != v.shape]
    return missing, unexpected, shapes


def check_checkpoint_fits(model: torch.nn.Module, ckpt: Any, *, source: str = 'the checkpoint',
                          model_name: str = 'the model') -> str | None:
    """Compare a whole-model checkpoint (mmengine layout) with ``model`` key by key and shape by shape.

    mmengine's ``load_checkpoint`` is not strict: a backbone-only or another model's checkpoint "loads" with a
    warning and leaves a randomly initialised detector. The tools call this first.

    The backbone part of a published whole-model checkpoint (official Swin detection / segmentation repositories,
    mmdet / mmseg model zoos) is converted to the model's layout first
    (:func:`mmplugin.converters.whole_model.convert_model_state_dict`), exactly as loading will do; everything
    else is compared as it is.

    Args:
        model: the model built from the config (a wrapper or TTA model is unwrapped).
        ckpt: the loaded checkpoint (``{'state_dict': ...}`` or a plain state dict).
        source, model_name: how the messages name the two.

    Returns:
        ``None`` when every key fits, else a message naming the first missing / unexpected / mismatched keys and
        what the checkpoint looks like.
    """
    while hasattr(model, 'module') and isinstance(model.module, torch.nn.Module):
        model = model.module
    sd = ckpt.get('state_dict', ckpt) if isinstance(ckpt, Mapping) else None
    if not isinstance(sd, Mapping):
        return f'{source} holds no state dict (got {type(ckpt).__name__})'
    sd = {re.sub(r'^module\.', '', str(k)): v for k, v in sd.items()}
    from ..converters.whole_model import convert_model_state_dict  # the converters import this module
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
        from ..converters.whole_model import backbone_file_layout
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


# ---------------------------------------------------------------------------------------------- mmengine hooks
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
