"""Reading checkpoint files: bad files, the tools on bad files, and whether a checkpoint fits the model.

Every bad input gets one clear error naming what the file looks like and what to do (empty, text, HTML page, Git
LFS pointer, truncated zip, forbidden pickled globals, unreadable file), also from tools/test.py, tools/infer.py and
tools/train.py --resume (rc 2, no traceback). Nothing is silently wrong: the tools load strictly (a backbone-only
checkpoint is not evaluated as a detector), missing BatchNorm counters load as PyTorch's strict load does, and a
missing weight inside a block is reported as an incomplete file, not as another arch.
"""
from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from mmengine.runner.checkpoint import _load_checkpoint, load_checkpoint
from torch import nn

from mmplugin.checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
    key_mismatch_is_structural,
    load_checkpoint_file,
)
from mmplugin.loading.fit import check_checkpoint_fits

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
DEMO_SEG = 'configs/demo/swiftformer_xs_semfpn_shapes.py'


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
    infer.py (mmengine would evaluate it as a random detector behind a warning) unless --allow-partial."""
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


def test_fit_rule_shared_by_backbone_loading():
    """``require_fit`` (behind every backbone load, ``plan_load``): BatchNorm counters and the optional prefixes
    may be absent; a file without any of the module's weights is called another family even when the module has
    BatchNorm counters; ``module.`` prefixes (also nested) are stripped once, in one place."""
    from mmplugin.checkpoint import require_fit, state_dict_mismatch, strip_module_prefix
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    model.add_module('norm3', nn.LayerNorm(4))
    own = model.state_dict()
    body = {k: v for k, v in own.items() if not k.startswith('norm3.') and not k.endswith('num_batches_tracked')}
    require_fit(own, body, optional_prefixes=('norm3.', ))  # fits: returns None
    assert state_dict_mismatch(body, own, optional_prefixes=('norm3.', )) == ([], [], [])
    assert state_dict_mismatch(body, own)[0] == ['norm3.weight', 'norm3.bias']
    with pytest.raises(CheckpointError, match="none of the model's weights are in the checkpoint"):
        require_fit(own, {'head.fc.weight': torch.zeros(2)}, optional_prefixes=('norm3.', ))
    with pytest.raises(CheckpointError, match=r"shape mismatch for '0.weight': checkpoint \(4, 3\) vs model "
                                              r"\(4, 3, 1, 1\)"):
        require_fit(own, dict(body, **{'0.weight': torch.zeros(4, 3)}))
    nested = {'module.module.0.weight': 1, 'module.1.bias': 2, 3: 3, 'x.module.y': 4}
    assert strip_module_prefix(nested) == {'0.weight': 1, '1.bias': 2, '3': 3, 'x.module.y': 4}
