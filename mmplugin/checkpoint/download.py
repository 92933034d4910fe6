"""Download a checkpoint URL once into the torch hub cache: progress bar, length and sha256 checks, file lock.

Used instead of ``torch.hub.load_state_dict_from_url``, which mmengine calls with ``weights_only=False``; the file
is loaded afterwards by :func:`mmplugin.checkpoint.load_checkpoint_file` (weights only).
"""
from __future__ import annotations

import hashlib
import os
import os.path as osp
import re
import sys
import time
from typing import Any

import torch

from mmplugin.checkpoint.atomic import _atomic_file, _locked
from mmplugin.checkpoint.errors import CheckpointError, CheckpointNotFoundError
from mmplugin.checkpoint.sniff import describe_file

__all__ = ['is_url', 'download_checkpoint']

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
                                          '(docs/configuring.md, "Pretrained weights")') from None
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
