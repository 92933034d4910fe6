"""A new backbone family costs one class: a toy family defined here passes the conformance suite and works with
tools/convert_checkpoint.py, tools/get_flops.py and tools/benchmark.py without any change outside this file."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import mmplugin  # noqa: F401
from mmplugin.models.backbones.base import FAMILIES, BaseBackbone
from mmplugin.testing.conformance import (
    check_bad_input,
    check_declared_shapes,
    check_empty_batch,
    check_freezing,
    check_grad_strides,
    check_layer_depths,
    check_norm_eval,
    check_reduced_precision,
    check_state_dict_roundtrip,
    check_with_cp,
)

ROOT = Path(__file__).resolve().parents[3]


def convert_toy(sd, out_indices=(0, 1, 2, 3)):
    """'Published' toy layout ``body.{i}.*`` -> ``stages.{i}.*``; classifier ``fc.*`` dropped."""
    dropped = [k for k in sd if k.startswith('fc.')]
    out = {re.sub(r'^body\.', 'stages.', k): v for k, v in sd.items() if not k.startswith('fc.')}
    return out, dropped


@pytest.fixture(scope='module')
def toy():
    class ToyNet(BaseBackbone):
        """Four stride-2 conv + BN + ReLU stages after a stride-2 stem (widths from the arch)."""

        family = 'toy'
        arch_zoo = {'mini': dict(widths=[8, 16, 24, 32]), 'wide': dict(widths=[16, 32, 48, 64])}
        arch_keys = ('widths', )
        converter = staticmethod(convert_toy)

        def __init__(self, arch='mini', drop_path_rate=0.0, **kwargs):
            super().__init__(drop_path_rate=drop_path_rate, **kwargs)
            widths = self.resolve_arch(arch)['widths']
            self._declare_stages(widths, [4, 8, 16, 32])
            self.stem = nn.Sequential(nn.Conv2d(self.in_channels, widths[0], 3, 2, 1), nn.BatchNorm2d(widths[0]),
                                      nn.ReLU())
            self.stages = nn.ModuleList(
                nn.Sequential(nn.Conv2d(widths[max(i - 1, 0)], w, 3, 2, 1), nn.BatchNorm2d(w), nn.ReLU())
                for i, w in enumerate(widths))
            self._add_out_norms(nn.BatchNorm2d)
            self._finish_init()

        @classmethod
        def detect(cls, state_dict):
            return any(re.match(r'(body|stages)\.\d+\.0\.weight$', k) for k in state_dict) and not any(
                'blocks' in k for k in state_dict)

        def stem_modules(self):
            return [self.stem]

        def stage_modules(self, i):
            return [self.stages[i]]

        def layer_depth(self, name):
            if name.startswith('stem.'):
                return 0
            m = re.match(r'(?:stages\.|norm)(\d+)', name)
            return int(m.group(1)) + 1 if m else self.num_layers - 1

        @property
        def num_layers(self):
            return self.num_stages + 2

        def forward_stem(self, x):
            return self.stem(x)

        def forward_stage(self, i, x):
            x = self.run_block(self.stages[i], x)
            return x, x

    yield ToyNet
    del FAMILIES['toy']


def _tool(name: str):
    """The command line of tools/<name>.py (mmplugin.cli.<name>)."""
    return importlib.import_module(f'mmplugin.cli.{name}')


@pytest.mark.parametrize('check', [check_declared_shapes, check_empty_batch, check_freezing, check_reduced_precision,
                                   check_bad_input, check_layer_depths, check_grad_strides])
def test_conformance(toy, check):
    check(toy, 'mini')


def test_norm_eval_with_cp_roundtrip(toy, monkeypatch, tmp_path):
    assert check_norm_eval(toy, 'mini')
    check_with_cp(toy, 'mini', monkeypatch)
    check_state_dict_roundtrip(toy, 'mini', tmp_path)


def test_layer_decay_optimizer(toy):
    from mmengine.optim import build_optim_wrapper

    class Detector(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = toy('mini')
            self.head = nn.Linear(32, 2)

    model = Detector()
    wrapper = build_optim_wrapper(model, dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=1.0),
                                              constructor='mmplugin.LayerDecayOptimWrapperConstructor',
                                              paramwise_cfg=dict(layer_decay_rate=0.5)))
    lrs = {id(p): g['lr'] for g in wrapper.optimizer.param_groups for p in g['params']}
    named = dict(model.named_parameters())
    assert lrs[id(named['backbone.stem.0.weight'])] == 0.5**5
    assert lrs[id(named['backbone.stages.2.0.weight'])] == 0.5**2
    assert lrs[id(named['head.weight'])] == 1.0


def test_tools_find_the_toy_family(toy, tmp_path, capsys):
    published = {re.sub(r'^stages\.', 'body.', k): v for k, v in toy('mini').state_dict().items()}
    published['fc.weight'] = torch.zeros(10, 32)
    src, dst = tmp_path / 'toy_published.pth', tmp_path / 'toy_plugin.pth'
    torch.save({'model': published}, src)
    assert _tool('convert_checkpoint').main([str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert 'toy: wrote' in out and 'fc.weight' in out
    model = toy('mini', init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    model.init_weights()
    assert torch.equal(model.state_dict()['stages.1.0.weight'], published['body.1.0.weight'])

    rows = _tool('get_flops').main(['--family', 'toy', '--sizes', '64x64'])
    params = {name: p for name, p, _ in rows}
    assert params == {'toy-mini': sum(p.numel() for p in toy('mini').parameters()),
                      'toy-wide': sum(p.numel() for p in toy('wide').parameters())}
    # MACs of the toy stem's first conv alone at 64x64: 32x32 outputs x 8 channels x 27 taps; the total is more
    assert rows[0][2][0] * 1e9 > 32 * 32 * 8 * 27

    res = _tool('benchmark').main(['toy', '--sizes', '32x32', '--rounds', '1'])
    assert list(res['sizes']['32x32']) == ['mmplugin'] and res['sizes']['32x32']['mmplugin'] > 0
