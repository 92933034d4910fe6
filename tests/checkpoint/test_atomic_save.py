"""Saving checkpoints atomically: readers see the old file or the complete new one, saved files get the mode the
umask gives, a save killed midway leaves nothing behind after the next save or resume, mmengine's local writes go
through the atomic path, and a resume names every checkpoint it skipped in one line."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmplugin.checkpoint import atomic_write_bytes, remove_stale_temporary_files

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.mark.parametrize('mask', [0o022, 0o002, 0o077])
def test_saved_files_follow_umask(tmp_path, mask):
    from mmengine.fileio.backends.local_backend import LocalBackend
    old = os.umask(mask)
    try:
        atomic_write_bytes(b'x', tmp_path / 'a.pth')
        LocalBackend().put(b'y', tmp_path / 'b.pth')
        with open(tmp_path / 'plain', 'wb'):
            pass
    finally:
        os.umask(old)
    want = 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / 'plain').stat().st_mode) == want  # the reference: open()
    for name in ('a.pth', 'b.pth'):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == want, oct((tmp_path / name).stat().st_mode)


_WRITER = textwrap.dedent('''
    import sys, time
    from mmplugin.checkpoint.atomic import _atomic_file
    with _atomic_file(sys.argv[1]) as (f, tmp):
        f.write(b'partial' * 1000)
        f.flush()
        print(tmp, flush=True)
        time.sleep(600)
''')


def test_save_killed_midway_leaves_nothing_after_next_save_or_resume(tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    proc = subprocess.Popen([PY, '-c', _WRITER, str(work / 'iter_6.pth')], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        tmp = Path(proc.stdout.readline().strip())
        assert tmp.exists() and tmp.name.startswith('.iter_6.pth.') and tmp.name.endswith('.tmp')
        assert remove_stale_temporary_files(work, at_resume=True) == [], 'a live write was removed'
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert tmp.exists() and not (work / 'iter_6.pth').exists()  # what a killed save leaves today
    # the next save: a recent file might be a save just starting, so age it as the next interval would
    atomic_write_bytes(b'new', work / 'iter_12.pth')
    assert tmp.exists(), 'removed a temporary file younger than a minute at a save'
    old = time.time() - 120
    os.utime(tmp, (old, old))
    atomic_write_bytes(b'new', work / 'iter_18.pth')
    assert not tmp.exists()
    # at resume, no age limit
    stale = work / '.iter_24.pth.abcd_123.tmp'
    stale.write_bytes(b'p')
    other = work / '.keep.txt.tmp'  # not this saver's name pattern
    other.write_bytes(b'k')
    assert remove_stale_temporary_files(work, at_resume=True) == [stale.name]
    assert other.exists() and sorted(p.name for p in work.iterdir()) == ['.keep.txt.tmp', 'iter_12.pth',
                                                                        'iter_18.pth']


def test_resume_names_every_skipped_checkpoint_in_one_line(tmp_path, capsys):
    from mmplugin.cli.runner import prepare_runner_cfg
    good = tmp_path / 'iter_10.pth'
    torch.save({'meta': {'iter': 10}}, good)
    (tmp_path / 'iter_20.pth').write_bytes(good.read_bytes()[:100])
    (tmp_path / 'iter_30.pth').write_bytes(b'')
    (tmp_path / 'iter_40.pth').write_text('<html><title>oops</title></html>')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_40.pth'))
    (tmp_path / '.iter_50.pth.zz99_abc.tmp').write_bytes(b'half')
    cfg = Config(dict(work_dir=str(tmp_path)))
    prepare_runner_cfg(cfg, Namespace(config='x.py', resume='auto', work_dir=str(tmp_path)))
    assert cfg.load_from == str(good) and cfg.resume
    lines = [ln for ln in capsys.readouterr().out.splitlines() if 'skipped' in ln]
    assert len(lines) == 1, lines
    for name, what in (('iter_40.pth', 'HTML page'), ('iter_30.pth', 'empty'), ('iter_20.pth', 'truncated')):
        assert f'{name} (' in lines[0] and what in lines[0], lines[0]
    assert lines[0].index('iter_40') < lines[0].index('iter_30') < lines[0].index('iter_20')
    assert not (tmp_path / '.iter_50.pth.zz99_abc.tmp').exists()


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / 'ckpt.pth'
    atomic_write_bytes(b'old', path)

    def boom(*a, **k):
        raise OSError('disk full')

    monkeypatch.setattr(os, 'replace', boom)
    with pytest.raises(OSError):
        atomic_write_bytes(b'new', path)
    assert path.read_bytes() == b'old'
    assert [p.name for p in tmp_path.iterdir()] == ['ckpt.pth'], 'temporary file left behind'


def test_mmengine_local_writes_are_atomic(tmp_path, monkeypatch):
    from mmengine.fileio.backends.local_backend import LocalBackend
    calls = []
    real = atomic_write_bytes.__globals__['os'].replace

    def spy(src, dst):
        calls.append((os.path.basename(src), os.path.basename(dst)))
        return real(src, dst)

    monkeypatch.setattr(os, 'replace', spy)
    LocalBackend().put(b'data', tmp_path / 'x.pth')
    assert (tmp_path / 'x.pth').read_bytes() == b'data'
    assert calls and calls[0][1] == 'x.pth' and calls[0][0].endswith('.tmp')
