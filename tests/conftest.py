"""Shared fixtures and helpers for the test suite."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import mmplugin  # noqa: F401  (registers models, installs safe loading)

DATA = Path(__file__).parent / 'data'


def official_keys(path: Path, section: str) -> dict[str, tuple[int, ...]]:
    """Parse ``key (d0, d1, ...)`` lines of the section whose header contains ``section``."""
    out, inside = {}, False
    for line in path.read_text().splitlines():
        if line.startswith(('===', '##')):
            inside = section in line
            continue
        m = re.match(r'\s+(\S+) \(([\d, ]*)\)$', line)
        if inside and m:
            out[m.group(1)] = tuple(int(d) for d in m.group(2).replace(' ', '').split(',') if d)
    return out


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors of the given shapes (BN variances positive, index buffers integer)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in shapes.items():
        if k.endswith('num_batches_tracked'):
            sd[k] = torch.tensor(7)
        elif k.endswith(('relative_position_index', )):
            sd[k] = torch.randint(0, 10, shape, generator=g)
        elif k.endswith('running_var'):
            sd[k] = torch.rand(shape, generator=g) + 0.5
        else:
            sd[k] = torch.randn(shape, generator=g) * 0.3
    return sd


def randomize_(module: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> torch.nn.Module:
    """Fill every parameter and float buffer with random values so equality tests cannot pass by accident."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if not p.is_floating_point() or 'relative_coords_table' in name:
                continue
            if name.endswith('running_var'):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith('weight') and p.ndim == 1:  # norm gains around 1
                p.copy_(1 + torch.randn(p.shape, generator=g) * scale)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope='session')
def _no_weights_only_override():
    assert 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD' not in os.environ
    yield
