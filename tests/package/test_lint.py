"""Lint is part of the suite: ruff with the repository's settings (pyproject.toml: pycodestyle errors and warnings,
pyflakes, import order, line length 120) passes on the package, the tests, the tools and the configs."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    exe = shutil.which('ruff', path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail('ruff is not installed: it is in the tests extra (pip install -e .[tests])')
    return [exe]


def test_ruff_passes():
    proc = subprocess.run([*_ruff(), 'check', '--no-cache', 'mmplugin', 'tests', 'tools', 'configs'], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_sees_a_violation(tmp_path):
    """The check can fail: a line over the limit and an unused import in a scratch file are both reported."""
    bad = tmp_path / 'bad.py'
    bad.write_text('import os\nx = "' + 'a' * 130 + '"\n')
    proc = subprocess.run([*_ruff(), 'check', '--no-cache', '--config', str(ROOT / 'pyproject.toml'), str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and 'E501' in proc.stdout and 'F401' in proc.stdout, proc.stdout
