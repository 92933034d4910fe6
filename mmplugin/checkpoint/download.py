"""Download a checkpoint URL once into the torch hub cache: progress bar, length and sha256 checks, file lock.

Used instead of ``torch.hub.load_state_dict_from_url``, which mmengine calls with ``weights_only=False``; the file
is loaded afterwards by :func:`mmplugin.checkpoint.load_checkpoint_file` (weights only).

Before any download, the file is looked for by its name in the folders of ``$MMPLUGIN_WEIGHTS`` (one or more,
separated like ``PATH``) and then in the torch hub cache, so a file fetched by hand or from a mirror works offline
(:func:`weights_folders`). A file found there or downloaded is checked against the sha256 it is expected to have:
the one passed in, else the leading hex digits its name carries (``NAME-<hex>.pth``: torch.hub's and OpenMMLab's
convention). A TLS, DNS or HTTP failure ends in one line naming the URL, the file name and the folder to put the
file in; certificate verification is never switched off.
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

__all__ = ['WEIGHTS_ENV', 'is_url', 'weights_folders', 'download_checkpoint']

#: folders searched by file name before downloading
WEIGHTS_ENV = 'MMPLUGIN_WEIGHTS'

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


def weights_folders() -> list[str]:
    """Where a checkpoint is looked for by file name, in order: every folder of ``$MMPLUGIN_WEIGHTS`` (separated
    by ``os.pathsep``), then ``<torch.hub.get_dir()>/checkpoints`` (where downloads go)."""
    own = [f for f in os.environ.get(WEIGHTS_ENV, '').split(os.pathsep) if f]
    return [osp.expanduser(f) for f in own] + [osp.join(torch.hub.get_dir(), 'checkpoints')]


def _expected_hash(name: str, sha256: str | None) -> str | None:
    """The full sha256 given, else the hex prefix the file name carries (None when neither)."""
    if sha256:
        return sha256.lower()
    m = _HASH_SUFFIX_RE.search(name)
    return m.group(1) if m and re.search('[a-f]', m.group(1)) else None


def _file_sha256(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            sha.update(chunk)
    return sha.hexdigest()


def _put_it_there(name: str) -> str:
    own = os.environ.get(WEIGHTS_ENV)
    where = own.split(os.pathsep)[0] if own else weights_folders()[-1]
    return (f'fetch {name} by other means (a browser, a mirror) and put it in {where}'
            + ('' if own else f' (or in a folder named by ${WEIGHTS_ENV})') + ': it is then used by name, offline')


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


def download_checkpoint(url: str, *, progress: bool | None = None, timeout: float = 60.0,
                        sha256: str | None = None) -> str:
    """The local path of ``url``'s file: found by name in :func:`weights_folders`, else downloaded once into
    ``<torch.hub.get_dir()>/checkpoints``.

    The bytes go to a temporary file that becomes the cached file only when the download is complete (the
    announced ``Content-Length`` arrived), looks like a PyTorch checkpoint (not an HTML or text page), and, when
    the file name ends in ``-<hex>`` (torch.hub's convention), its sha256 starts with that hex. A failed or
    interrupted download never leaves a file behind. Processes of one machine that ask at the same time download
    once (file lock); the others reuse the result.

    Args:
        url: ``http://`` or ``https://`` address.
        progress: show a progress bar on stderr; default: when stderr is a terminal.
        timeout: seconds to wait for the connection and for each read.
        sha256: the file's full sha256, when known; else the hex digits its name carries are checked.

    Raises:
        CheckpointNotFoundError: HTTP 404 or 410.
        CheckpointError: any other failure (a file whose sha256 differs, TLS, DNS, HTTP), with what happened and
            what to do.
    """
    name = _cache_name(url)
    want = _expected_hash(name, sha256)
    *own, folder = weights_folders()
    for candidate in [osp.join(f, name) for f in own]:  # put there by hand: checked like a download
        if osp.isfile(candidate):
            got = _file_sha256(candidate) if want else ''
            if want and not got.startswith(want):
                raise CheckpointError(f'{candidate} (for {url}) is not the published file: its sha256 starts with '
                                      f'{got[:len(want)]}, expected {want}; replace it')
            return candidate
    os.makedirs(folder, exist_ok=True)
    dst = osp.join(folder, name)
    with _locked(osp.join(folder, f'.{name}.lock')):
        if not osp.isfile(dst):
            _download(url, dst, sys.stderr.isatty() if progress is None else progress, timeout, want)
    return dst


def _network_reason(err: BaseException) -> str:
    """What went wrong, in words: TLS (certificate), DNS (name resolution), timeout, refused connection."""
    import socket
    import ssl
    reason = getattr(err, 'reason', err)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f'the TLS certificate of the server could not be verified ({reason.verify_message}); verification '
                'stays on')
    if isinstance(reason, ssl.SSLError):
        return f'TLS failed ({reason}); verification stays on'
    if isinstance(reason, socket.gaierror):
        return f'the host name could not be resolved ({reason.strerror or reason})'
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return 'the connection timed out'
    if isinstance(reason, ConnectionRefusedError):
        return 'the connection was refused'
    return str(reason)


def _download(url: str, dst: str, progress: bool, timeout: float, want: str | None) -> None:
    import urllib.error
    import urllib.request
    offline = _put_it_there(osp.basename(dst))
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
        raise CheckpointError(f'cannot download {url}: {_network_reason(err)}; {offline}') from None
    hash_prefix = want
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
                                      f'{sha.hexdigest()[:len(hash_prefix)]}, expected {hash_prefix}; '
                                      'nothing was cached: run again')
    finally:
        bar.close()
