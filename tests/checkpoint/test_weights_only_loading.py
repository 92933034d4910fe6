"""Weights-only loading of real checkpoints: mmengine runner checkpoints (``HistoryBuffer``, numpy, ``ConfigDict``)
need exactly the allow-list and load through every mmengine entry point, a resume works after ``import mmplugin``;
malicious pickles are refused by every loader without running, missing and corrupt files raise clear errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.runner import Runner
from mmengine.runner.checkpoint import _load_checkpoint, load_checkpoint
from torch import nn
from torch.utils.data import Dataset

from mmplugin.checkpoint import CheckpointError, UnsafeCheckpointError, load_checkpoint_file


class _ToyData(Dataset):

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return dict(inputs=torch.full((2, ), float(i)), labels=torch.tensor([float(i)]))


class _ToyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, labels=None, mode='tensor'):
        out = self.linear(inputs)
        return dict(loss=((out - labels)**2).mean()) if mode == 'loss' else out


def _runner(work_dir, max_iters, **kw):
    return Runner(
        model=_ToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=_ToyData(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=2,
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01)),
        param_scheduler=dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=2),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False)),
        experiment_name=f'toy_{os.getpid()}_{id(work_dir)}_{max_iters}', **kw)


@pytest.fixture(scope='module')
def runner_ckpt(tmp_path_factory):
    work = tmp_path_factory.mktemp('runner')
    _runner(work, 2).train()
    path = work / 'iter_2.pth'
    assert path.is_file()
    return path


def test_runner_checkpoint_needs_the_allow_list(runner_ckpt):
    """Proof the fix matters: without mmplugin, torch's weights-only loader refuses this very file."""
    code = f'import torch; torch.load({str(runner_ckpt)!r}, weights_only=True)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and 'Weights only load failed' in out.stderr


def test_runner_checkpoint_loads_weights_only(runner_ckpt):
    ckpt = _load_checkpoint(str(runner_ckpt), map_location='cpu')
    assert set(ckpt) >= {'meta', 'state_dict', 'message_hub', 'optimizer', 'param_schedulers'}
    from mmengine.logging import HistoryBuffer
    scalars = ckpt['message_hub']['log_scalars']
    assert any(isinstance(v, HistoryBuffer) for v in scalars.values())
    assert ckpt['optimizer']['state'], 'AdamW state must be present'
    assert ckpt['meta']['iter'] == 2


def test_runner_resume_after_import(runner_ckpt, tmp_path):
    runner = _runner(tmp_path, 4, load_from=str(runner_ckpt), resume=True)
    runner.train()
    assert runner.iter == 4


class _Evil:

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


@pytest.mark.parametrize('container', ['zip', 'legacy'])
def test_malicious_pickle_is_refused_and_does_not_run(tmp_path, container):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    payload = {'state_dict': {'w': torch.zeros(2)}, 'meta': _Evil(marker)}
    torch.save(payload, path, _use_new_zipfile_serialization=(container == 'zip'))
    for loader in (lambda: _load_checkpoint(str(path)), lambda: load_checkpoint_file(path),
                   lambda: load_checkpoint(nn.Linear(1, 1), str(path))):
        with pytest.raises(UnsafeCheckpointError, match=r'system') as info:
            loader()
        assert 'Nothing in the file was executed' in str(info.value)
    assert not marker.exists(), 'the pickled payload ran'


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match='not found'):
        load_checkpoint_file(tmp_path / 'nope.pth')
    good = tmp_path / 'good.pth'
    torch.save({'w': torch.randn(1000)}, good)
    bad = tmp_path / 'truncated.pth'
    bad.write_bytes(good.read_bytes()[:300])
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        load_checkpoint_file(bad)
    junk = tmp_path / 'junk.pth'
    junk.write_bytes(b'not a checkpoint at all')
    with pytest.raises(CheckpointError, match='not a readable PyTorch checkpoint'):
        _load_checkpoint(str(junk))


def test_config_dict_in_checkpoint_loads(tmp_path):
    path = tmp_path / 'meta.pth'
    torch.save({'meta': {'cfg': Config(dict(a=1)).to_dict(), 'cd': Config(dict(b=dict(c=2)))._cfg_dict},
                'state_dict': {}}, path)
    ckpt = load_checkpoint_file(path)
    assert ckpt['meta']['cd']['b']['c'] == 2
