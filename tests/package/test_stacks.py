"""Both OpenMMLab stacks: the original distributions (mmengine, mmcv, mmdet, mmsegmentation) and the maintained
onedl-* forks provide the same import names, so the plugin's metadata names neither in its base dependencies
(extras ``openmmlab`` / ``onedl`` carry the tested ranges, ``requirements/<stack>.txt`` the exact versions);
installing the plugin into an environment that has a stack needs nothing new from either (pip's own resolver,
offline, on this environment: CI runs this on both stacks); an environment with both, or neither, is named in one
line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from mmplugin.utils import stack

ROOT = Path(__file__).resolve().parents[2]
OPENMMLAB = {'mmengine', 'mmcv', 'mmdet', 'mmsegmentation', 'mmcv-lite'}
ONEDL = {'onedl-mmengine', 'onedl-mmcv', 'onedl-mmdetection', 'onedl-mmsegmentation'}


def _project() -> dict:
    import tomllib  # Python >= 3.11
    return tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']


def test_metadata_names_no_stack_outside_its_extra():
    project = _project()
    base = {Requirement(r).name for r in project['dependencies']}
    assert not base & (OPENMMLAB | ONEDL)
    extras = project['optional-dependencies']
    for name, dists in (('openmmlab', OPENMMLAB - {'mmcv-lite'}), ('onedl', ONEDL)):
        reqs = [Requirement(r) for r in extras[name]]
        assert {r.name for r in reqs} == dists
        pins = dict(line.split('==') for line in (ROOT / f'requirements/{name}.txt').read_text().splitlines()
                    if line and not line.startswith('#'))
        assert set(pins) == dists
        for r in reqs:  # every range holds the version the suite runs on, and has an upper bound
            assert r.specifier.contains(pins[r.name]) and any(s.operator == '<' for s in r.specifier), r


def test_installing_needs_nothing_new_from_either_stack(tmp_path):
    """``pip install --dry-run --no-index`` of the checkout into this environment: it resolves offline (so no
    dependency is missing or would be replaced) and would install the plugin alone."""
    report = tmp_path / 'report.json'
    proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation',
                           '--quiet', '--report', str(report), str(ROOT)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = [item['metadata']['name'] for item in json.loads(report.read_text())['install']]
    assert names == ['mmplugin'], names
    assert stack.installed_stack() in ('openmmlab', 'onedl')
    assert stack.duplicated_packages() is None and stack.missing_packages() is None


@pytest.mark.parametrize('installed,kind,duplicated,missing', [
    ({'mmengine': '0.10.7', 'mmcv': '2.1.0', 'mmdet': '3.3.0', 'mmsegmentation': '1.2.2'}, 'openmmlab', None, None),
    ({'onedl-mmengine': '0.10.12', 'onedl-mmcv': '2.3.6', 'onedl-mmdetection': '3.5.1',
      'onedl-mmsegmentation': '1.4.2'}, 'onedl', None, None),
    ({'onedl-mmengine': '0.10.12', 'mmengine': '0.10.7', 'onedl-mmcv': '2.3.6', 'onedl-mmdetection': '3.5.1',
      'onedl-mmsegmentation': '1.4.2'}, 'mixed', 'mmengine from', None),
    ({'mmengine': '0.10.7'}, 'openmmlab', None, 'mmcv, mmdet, mmseg not installed'),
    ({}, None, None, 'mmplugin[onedl]'),
])
def test_stack_detection(monkeypatch, installed, kind, duplicated, missing):
    monkeypatch.setattr(stack, '_version', lambda dist: installed.get(dist))
    assert stack.installed_stack() == kind
    for got, want in ((stack.duplicated_packages(), duplicated), (stack.missing_packages(), missing)):
        assert (got is None) if want is None else (want in got), got


def test_script_prints_the_stack():
    out = subprocess.run([sys.executable, str(ROOT / 'mmplugin/utils/stack.py')], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.split(':')[0] in ('openmmlab', 'onedl'), out
