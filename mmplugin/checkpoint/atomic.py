"""Atomic file writes (temporary file in the same folder, ``fsync``, ``os.replace``, mode from the umask), advisory
locks, and removal of the temporary files that a killed save left behind.

A run killed during a save never leaves a truncated checkpoint: readers see the old file or the complete new one.
"""
from __future__ import annotations

import contextlib
import os
import os.path as osp
import re
import tempfile
import time

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; stale files are then only removed at resume
    fcntl = None

__all__ = ['atomic_write_bytes', 'remove_stale_temporary_files']

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
