"""Small command-line behaviours: tools/get_flops.py accepts a single size (``--sizes 64``) and refuses a malformed
one with rc 2 and no traceback; tools/demo.sh stops with the failing step's exit code, never evaluates a stale
checkpoint, and filters build-settings noise from what it shows (stub commands, no real training)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def _run(*args, timeout=600, env=None):
    return subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


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
