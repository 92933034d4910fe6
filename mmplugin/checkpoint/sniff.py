"""What a file that is not a PyTorch checkpoint looks like (empty, text, HTML page, Git LFS pointer, truncated zip,
safetensors, tar / gzip archive, ...), from its first bytes and its size, so errors can say what to do."""
from __future__ import annotations

import os
import os.path as osp
import re
import zipfile

__all__ = ['describe_file']

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
