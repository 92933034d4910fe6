"""Checkpoint input and output around the backbones: bad checkpoint files, strict tools, resume, saving, setup.

Every bad input gets a clear answer naming what the file looks like and what to do; nothing is silently wrong
(a backbone-only checkpoint is not evaluated as a detector); nothing is lost or left behind (umask, stale
temporary files, skipped checkpoints named).
"""
from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import runpy
import signal
import stat
import subprocess
import sys
import textwrap
import time
import types
import zipfile
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import _load_checkpoint, load_checkpoint
from torch import nn

from mmplugin.checkpoint import (CheckpointError, CheckpointNotFoundError, UnsafeCheckpointError, atomic_write_bytes,
                                 check_checkpoint_fits, key_mismatch_is_structural, load_checkpoint_file,
                                 remove_stale_temporary_files)

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DEMO_SEG = 'configs/demo/swiftformer_xs_semfpn_shapes.py'


def _mmcv_ops():
    """tools/mmcv_ops.py, which runs before the package is installed, so it is not part of it: its functions."""
    return types.SimpleNamespace(**runpy.run_path(str(ROOT / 'tools' / 'mmcv_ops.py'), run_name='mmcv_ops'))


def _run(*args, timeout=600, env=None):
    return subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _good_bytes() -> bytes:
    buf = io.BytesIO()
    torch.save({'state_dict': {'w': torch.arange(4000.)}}, buf)
    return buf.getvalue()


class _Evil:

    def __reduce__(self):
        return (os.system, ('true', ))


_LFS = (b'version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2'
        b'ca24d17e2393\nsize 52345678\n')
_DRIVE = (b'<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head><body>Google Drive '
          b"can't scan this file for viruses.</body></html>")

# name -> (file bytes, expected words in the message)
BAD_FILES = {
    'empty': (b'', 'empty (0 bytes)'),
    'text_hello': (b'hello world\n', 'a text file'),
    'text_e': (b'e', 'a text file'),  # first bytes decide torch's failure: IndexError / KeyError / advice
    'text_json': (b'{"a": 1}\n', 'a text file'),
    'text_brace': (b'}', 'a text file'),
    'html_drive': (_DRIVE, 'an HTML page titled'),
    'html_plain': (b'\n  <html><body>404 Not Found</body></html>', 'an HTML page'),
    'lfs': (_LFS, 'Git LFS pointer'),
    'truncated_zip': (None, 'truncated or corrupt zip'),
    'gzip': (gzip.compress(b'x' * 100), 'gzip'),
    'zip_not_ckpt': (None, 'zip archive but not a PyTorch checkpoint'),
    'binary': (bytes(range(7, 200)), 'not a PyTorch checkpoint'),
}
ADVICE = {'empty': 'download or copy it again', 'lfs': 'git lfs pull', 'html_drive': 'Google Drive',
          'truncated_zip': 'download or copy it again', 'text_hello': 'check the path'}


def _write_bad(tmp_path: Path, name: str) -> Path:
    data, _ = BAD_FILES[name]
    if name == 'truncated_zip':
        data = _good_bytes()[:-700]
    elif name == 'zip_not_ckpt':
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, 'w') as z:
            z.writestr('readme.txt', 'hi')
        data = buf.getvalue()
    path = tmp_path / f'{name}.pth'
    path.write_bytes(data)
    return path


@pytest.mark.parametrize('name', sorted(BAD_FILES))
def test_bad_file_gets_one_clear_error(tmp_path, name):
    path = _write_bad(tmp_path, name)
    for loader in (lambda: load_checkpoint_file(path), lambda: _load_checkpoint(str(path)),
                   lambda: load_checkpoint(nn.Linear(1, 1), str(path))):
        with pytest.raises(CheckpointError) as info:
            loader()
        msg = str(info.value)
        assert BAD_FILES[name][1] in msg, msg
        assert 'weights_only' not in msg, msg
        assert 'To fix:' in msg and str(path) in msg, msg
        if name in ADVICE:
            assert ADVICE[name] in msg, msg


def test_every_prefix_and_random_bytes_raise_only_checkpoint_error(tmp_path):
    """Whatever the file holds, loading returns its content or raises CheckpointError, never another type."""
    good = _good_bytes()
    g = torch.Generator().manual_seed(0)
    blobs = [good[:n] for n in range(0, len(good), max(1, len(good) // 60))]
    blobs += [bytes(torch.randint(0, 256, (n, ), generator=g, dtype=torch.uint8).tolist()) for n in (1, 2, 9, 300)]
    blobs += [pickle.dumps(v, protocol=p) for v in (None, 3, 'x', [1]) for p in (0, 2)]
    path = tmp_path / 'x.pth'
    for blob in blobs:
        path.write_bytes(blob)
        try:
            load_checkpoint_file(path)
        except CheckpointError as err:
            assert 'weights_only' not in str(err)
        except Exception as err:  # noqa: BLE001
            pytest.fail(f'{type(err).__name__} for {blob[:20]!r}: {err}')


def test_forbidden_globals_named_and_missing_file_is_both_errors(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'w': torch.zeros(1), 'x': _Evil()}, path)
    with pytest.raises(UnsafeCheckpointError, match=r'posix\.system|os\.system') as info:
        load_checkpoint_file(path)
    assert 'weights_only' not in str(info.value)
    with pytest.raises(CheckpointNotFoundError) as info:
        load_checkpoint_file(tmp_path / 'nope.pth')
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, CheckpointError)



def test_unreadable_file_is_a_checkpoint_error(tmp_path, monkeypatch):
    import builtins

    import mmplugin.checkpoint as ck
    locked = tmp_path / 'locked.pth'
    torch.save({'w': torch.zeros(1)}, locked)
    real_open = builtins.open

    def deny(file, *args, **kwargs):  # what chmod 000 does for a non-root user (the tests may run as root)
        if str(file) == str(locked):
            raise PermissionError(13, 'Permission denied', str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, 'open', deny)
    with pytest.raises(ck.CheckpointError, match='cannot read .*Permission denied; check its permissions'):
        ck.load_checkpoint_file(locked)


# ------------------------------------------------------------------------------------------------ tools on bad files
@pytest.fixture(scope='module')
def tiny_demo(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo')
    out = _run('tools/make_demo_data.py', '--root', str(root), '--num-train', '2', '--num-val', '2')
    assert out.returncode == 0, out.stderr
    return root


def _seg_opts(root: Path) -> list[str]:
    sub = root / 'shapes_ade'
    return ['--cfg-options', f'train_dataloader.dataset.data_root={sub}', f'val_dataloader.dataset.data_root={sub}',
            f'test_dataloader.dataset.data_root={sub}']


@pytest.mark.parametrize('tool,name', [('test.py', 'text_e'), ('infer.py', 'html_drive'), ('train --resume', 'lfs')])
def test_tools_report_bad_checkpoint_without_traceback(tmp_path, tiny_demo, tool, name):
    path = str(_write_bad(tmp_path, name))
    image = str(tiny_demo / 'shapes_ade/images/validation/00000.png')
    args = {'test.py': ('tools/test.py', DEMO_SEG, path, '--work-dir', str(tmp_path / 'w'), *_seg_opts(tiny_demo)),
            'infer.py': ('tools/infer.py', DEMO_SEG, path, image, '--out', str(tmp_path / 'o.png')),
            'train --resume': ('tools/train.py', DEMO_SEG, '--resume', path, '--work-dir', str(tmp_path / 'w'),
                               *_seg_opts(tiny_demo))}[tool]
    out = _run(*args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert BAD_FILES[name][1] in out.stderr and 'Traceback' not in out.stderr, out.stderr[-2000:]
    assert 'weights_only' not in out.stderr + out.stdout


@pytest.mark.slow
def test_tools_load_strictly(tmp_path, tiny_demo):
    """A checkpoint tools/train.py wrote passes the strict check; a backbone-only one is refused by test.py and
    infer.py (it used to be evaluated as a random detector behind a warning) unless --allow-partial."""
    work = tmp_path / 'train'
    out = _run('tools/train.py', DEMO_SEG, '--work-dir', str(work), *_seg_opts(tiny_demo), 'train_cfg.max_iters=1',
               'train_cfg.val_interval=100', 'default_hooks.checkpoint.interval=1', 'train_dataloader.batch_size=2',
               'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False')
    assert out.returncode == 0 and (work / 'iter_1.pth').exists(), out.stderr[-3000:]
    out = _run('tools/test.py', DEMO_SEG, str(work / 'iter_1.pth'), '--work-dir', str(tmp_path / 'w'),
               *_seg_opts(tiny_demo))
    assert out.returncode == 0 and re.search(r"'mIoU': [\d.]+", out.stdout), out.stderr[-3000:]

    from mmplugin.models import SwiftFormer
    backbone_only = tmp_path / 'backbone.pth'
    torch.save({'state_dict': SwiftFormer('xs').state_dict()}, backbone_only)
    out = _run('tools/test.py', DEMO_SEG, str(backbone_only), '--work-dir', str(tmp_path / 'w'), *_seg_opts(tiny_demo))
    assert out.returncode == 2 and not re.search(r"'mIoU': [\d.]+", out.stdout), out.stderr[-2000:]
    assert 'Traceback' not in out.stderr
    assert 'keys are missing (first: backbone.' in out.stderr and 'backbone weights only' in out.stderr
    assert 'Pass --allow-partial' in out.stderr
    image = str(tiny_demo / 'shapes_ade/images/validation/00000.png')
    args = ('tools/infer.py', DEMO_SEG, str(backbone_only), image, '--out', str(tmp_path / 'o.png'))
    out = _run(*args)
    assert out.returncode == 2 and 'does not fit' in out.stderr and not (tmp_path / 'o.png').exists()
    out = _run(*args, '--allow-partial')
    assert out.returncode == 0 and 'warning (--allow-partial)' in out.stderr and (tmp_path / 'o.png').exists()


def test_check_checkpoint_fits_messages():
    class Det(nn.Module):

        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
            self.neck = nn.Linear(4, 2)

    model = Det()
    full = model.state_dict()
    assert check_checkpoint_fits(model, {'state_dict': full}) is None
    no_counter = {k: v for k, v in full.items() if not k.endswith('num_batches_tracked')}
    assert check_checkpoint_fits(model, no_counter) is None
    wrapped = {'state_dict': {f'module.{k}': v for k, v in full.items()}}
    assert check_checkpoint_fits(nn.DataParallel(model), wrapped) is None
    msg = check_checkpoint_fits(model, {k[len('backbone.'):]: v for k, v in full.items() if 'backbone' in k})
    assert 'missing (first: backbone.0.weight' in msg and 'backbone weights only' in msg
    msg = check_checkpoint_fits(model, {'roi_head.fc.weight': torch.zeros(2, 2)})
    assert 'No key matches' in msg and 'unexpected' in msg
    bad = dict(full, **{'neck.weight': torch.zeros(3, 4)})
    assert 'neck.weight (3, 4) vs (2, 4)' in check_checkpoint_fits(model, bad)


# ------------------------------------------------------------------------------------------------ num_batches_tracked
def _swiftformer_ckpt(tmp_path: Path, drop=lambda k: False, extra=None) -> tuple[Path, dict]:
    from mmplugin.models import SwiftFormer
    src = SwiftFormer('xs')
    for m in src.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.num_batches_tracked.fill_(11)
            m.running_mean.normal_()
    sd = {k: v for k, v in src.state_dict().items() if not drop(k)}
    sd.update(extra or {})
    path = tmp_path / 'sf.pth'
    torch.save({'state_dict': sd}, path)
    return path, sd


def test_missing_num_batches_tracked_loads_like_pytorch(tmp_path):
    from mmplugin.models import SwiftFormer
    path, sd = _swiftformer_ckpt(tmp_path, drop=lambda k: k.endswith('num_batches_tracked'))
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ref = SwiftFormer('xs')
    for net in (model, ref):  # a counter that is not the initial 0, to see what loading does with it
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.num_batches_tracked.fill_(5)
    model.init_weights()
    # the reference: PyTorch's own strict load of the same plain dict (no version metadata)
    ref.load_state_dict(dict(sd), strict=True)
    got, want = model.state_dict(), ref.state_dict()
    counters = [k for k in want if k.endswith('num_batches_tracked')]
    assert counters
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_missing_weight_inside_a_block_is_listed_not_called_another_arch(tmp_path):
    from mmplugin.models import SwiftFormer
    gone = 'stages.2.blocks.1.pwconv1.weight'
    path, _ = _swiftformer_ckpt(tmp_path, drop=lambda k: k == gone)
    with pytest.raises(CheckpointError) as info:
        SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(path))).init_weights()
    msg = str(info.value)
    assert gone in msg and 'incomplete' in msg and 'for another arch' not in msg, msg


def test_structural_diagnosis():
    model = ['stages.0.blocks.0.w', 'stages.0.blocks.1.w', 'stages.1.blocks.0.w', 'norm.w']
    ckpt = ['stages.0.blocks.0.w', 'stages.1.blocks.0.w', 'norm.w']
    assert key_mismatch_is_structural(['stages.0.blocks.1.w'], [], model, ckpt)  # fewer blocks
    assert key_mismatch_is_structural([], ['stages.2.blocks.0.w'], ckpt, ckpt + ['stages.2.blocks.0.w'])
    assert not key_mismatch_is_structural(['norm.w'], [], model, model[:-1])  # no numbered container
    assert not key_mismatch_is_structural(['stages.0.blocks.0.b'], [], model + ['stages.0.blocks.0.b'], model)


# ------------------------------------------------------------------------------------------------ saving and resume
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
    from mmplugin.checkpoint import _atomic_file
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
    from mmplugin.utils import prepare_runner_cfg
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


# ------------------------------------------------------------------------------------------------ small tools
def test_get_flops_accepts_a_single_int(capsys, monkeypatch):
    import mmplugin.cli.get_flops as mod
    rows = mod.main(['--family', 'swiftformer', '--arch', 'xs', '--sizes', '64', '32x64'])  # one arch: fast
    assert 'GMACs@64x64' in capsys.readouterr().out
    assert rows[0][0] == 'swiftformer-xs' and len(rows[0][2]) == 2 and rows[0][2][0] > rows[0][2][1] > 0
    with pytest.raises(SystemExit) as info:
        mod.main(['--sizes', '224x'])
    assert info.value.code == 2 and "--sizes: '224x' is not a size" in capsys.readouterr().err
    out = _run('tools/get_flops.py', '--sizes', '224x', timeout=120)
    assert out.returncode == 2 and "--sizes: '224x' is not a size" in out.stderr and 'Traceback' not in out.stderr


_BUILD_LINE = ('  - Build settings: BUILD_TYPE=Release, CXX_FLAGS= -D_GLIBCXX_USE_CXX11_ABI=1 -Wall '
               '-Werror=return-type -Werror=non-virtual-dtor -Wno-error=old-style-cast, TORCH_VERSION=2.13.0')


def _stub_demo(tmp_path: Path, train_rc: int) -> Path:
    """A copy of tools/demo.sh next to stub setup / python commands (no real training)."""
    root = tmp_path / 'repo'
    (root / 'tools').mkdir(parents=True)
    (root / '.venv/bin').mkdir(parents=True)
    (root / 'tools/demo.sh').write_text((ROOT / 'tools/demo.sh').read_text())
    (root / 'tools/setup_env.sh').write_text('exit 0\n')
    stub = root / '.venv/bin/python'
    stub.write_text(textwrap.dedent(f'''\
        #!/usr/bin/env bash
        echo "called $*" >> "{tmp_path}/calls"
        case "$1" in
          tools/train.py)
            echo "{_BUILD_LINE}"
            echo "Iter(train) [1/2] loss: 1.0"
            echo "RuntimeError: out of memory" >&2
            [ {train_rc} -eq 0 ] && mkdir -p "$4" && echo "$4/iter_2.pth" > "$4/last_checkpoint"
            exit {train_rc} ;;
          tools/test.py) echo "{_BUILD_LINE}"; echo "bbox_mAP: 0.5"; exit 0 ;;
        esac
        exit 0
    '''))
    stub.chmod(0o755)
    return root


def test_demo_stops_with_the_failing_steps_exit_code_and_filters_output(tmp_path):
    root = _stub_demo(tmp_path, train_rc=3)
    out = subprocess.run(['bash', 'tools/demo.sh'], cwd=root, capture_output=True, text=True, timeout=60,
                         env={**os.environ, 'DEMO_ITERS': '2'})
    assert out.returncode == 3, out.stdout + out.stderr
    assert 'failed with exit code 3' in out.stderr and 'last_checkpoint' not in out.stderr
    assert 'tools/test.py' not in (tmp_path / 'calls').read_text()  # no stale checkpoint evaluated
    shown = out.stdout
    assert 'Iter(train) [1/2]' in shown and 'RuntimeError: out of memory' in shown
    assert 'Build settings' not in shown, shown
    (tmp_path / 'calls').unlink()
    root = _stub_demo(tmp_path / 'ok', train_rc=0)
    out = subprocess.run(['bash', 'tools/demo.sh'], cwd=root, capture_output=True, text=True, timeout=60,
                         env={**os.environ, 'DEMO_ITERS': '2', 'DEMO_SKIP_SEG': '1'})
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'bbox_mAP: 0.5' in out.stdout and 'Build settings' not in out.stdout
    assert re.search(r'step 2/4: training .* \(elapsed \d+ s, ETA [0-9:]+, about \d+ s left\)', out.stdout), out.stdout
    calls = (tmp_path / 'ok/calls').read_text()
    for sub in ('det-pictures', 'curves', 'summary --det-test'):
        assert f'tools/demo_report.py {sub}' in calls, calls
    assert '--time data=' in calls and '--time det_train=' in calls and 'det_result.png' in calls


# ------------------------------------------------------------------------------------------------ setup with CUDA
def _fake_wheel(path: Path, ext_bytes: bytes | None) -> Path:
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('mmcv/__init__.py', '')
        if ext_bytes is not None:
            z.writestr('mmcv/_ext.cpython-311-x86_64-linux-gnu.so', ext_bytes)
    return path


def test_setup_plan_decisions():
    ops = _mmcv_ops()
    cpu = dict(torch_version='2.13.0+cpu', torch_cuda=None, gpu_visible=False, nvcc=None)
    assert ops.plan(**cpu, force_cuda=False) == ('cpu', [])
    with pytest.raises(ops.SetupError, match='FORCE_CUDA=1 but torch 2.13.0.cpu is a CPU-only build'):
        ops.plan(**cpu, force_cuda=True)
    cu = dict(torch_version='2.5.1+cu121', torch_cuda='12.1')
    kind, warns = ops.plan(**cu, gpu_visible=False, force_cuda=False, nvcc=None)  # login node
    assert kind == 'cpu' and 'FORCE_CUDA=1' in warns[0] and 'no GPU is visible' in warns[0]
    with pytest.raises(ops.SetupError) as info:  # GPU, no compiler: stop before the build
        ops.plan(**cu, gpu_visible=True, force_cuda=False, nvcc=None)
    msg = str(info.value)
    assert 'no CUDA compiler (nvcc)' in msg and 'CUDA_HOME' in msg and 'CUDA_VISIBLE_DEVICES=' in msg
    assert ops.plan(**cu, gpu_visible=False, force_cuda=True, nvcc='/cuda/bin/nvcc', nvcc_release='12.4') == \
        ('cuda', [])
    with pytest.raises(ops.SetupError, match='major versions must match'):
        ops.plan(**cu, gpu_visible=True, force_cuda=False, nvcc='/cuda/bin/nvcc', nvcc_release='11.8')


def test_cpu_only_wheel_not_reused_where_cuda_ops_are_needed(tmp_path):
    ops = _mmcv_ops()
    cpu_dir, cuda_dir = tmp_path / 'torch-cp311', tmp_path / 'torch-cp311-cudaops'
    cpu_dir.mkdir()
    cuda_dir.mkdir()
    cpu = _fake_wheel(cpu_dir / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl', b'\x7fELF libtorch_cpu.so libc10.so')
    lite = _fake_wheel(tmp_path / 'mmcv-2.1.0-py3-none-any.whl', None)
    assert ops.wheel_ops(str(cpu)) == 'cpu' and ops.wheel_ops(str(lite)) == 'none'
    refused = []
    assert ops.pick_wheel('cuda', [str(cpu_dir)], log=refused.append) is None
    assert 'CPU-only compiled ops' in refused[0] and 'CUDA ops are needed' in refused[0]
    assert ops.pick_wheel('cpu', [str(cpu_dir)]) == str(cpu)
    cuda = _fake_wheel(cuda_dir / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl',
                       b'\x7fELF libc10_cuda.so libcudart.so.12 libtorch_cuda.so')
    assert ops.wheel_ops(str(cuda)) == 'cuda'
    assert ops.pick_wheel('cuda', [str(cuda_dir), str(cpu_dir)]) == str(cuda)
    assert ops.pick_wheel('cpu', [str(cuda_dir)]) == str(cuda)  # CUDA ops include the CPU ones


def test_installed_cpu_mmcv_is_classified_and_verified(monkeypatch):
    """The real extension of this environment's CPU build has none of the CUDA markers; verify() passes on the
    CPU and, when a GPU is (pretended to be) visible, refuses it for lacking CUDA ops."""
    import mmcv
    ops = _mmcv_ops()
    ext = sorted(Path(mmcv.__file__).parent.glob('_ext*.so'))
    assert ext, 'mmcv without compiled ops'
    if torch.version.cuda is None:
        assert not any(m in ext[0].read_bytes() for m in ops._CUDA_MARKERS)
    assert ops.verify() is None
    if torch.cuda.is_available():
        return
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    problem = ops.verify()
    assert problem and 'CUDA tensors' in problem and 'without CUDA ops' in problem
