"""What a user sees when a tool is given something wrong, and what the tools check: a mistake ends as one
``error: ...`` line with exit code 2 (an unknown arch, a mistyped backbone keyword or ``mmplugin.`` type with the
closest valid name, a missing checkpoint); a checkpoint is checked against the part that is used (a backbone-only
file exports the backbone, not the neck); FLOP counting reports progress per model; the timing tools warn on a
loaded machine; training-step peak memory comes from a fresh process."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mmplugin.cli.export as export_tool
import mmplugin.cli.get_flops as get_flops_tool
from mmplugin.analysis import load_warning
from mmplugin.cli.common import TRACEBACK_ENV, closest

ROOT = Path(__file__).resolve().parents[2]
DET = str(ROOT / 'configs/demo/swiftformer_xs_maskrcnn_shapes.py')
SWIN_DET = str(ROOT / 'configs/swin/swin_t_maskrcnn_1x_coco.py')


def _export(capsys, *args):
    """tools/export.py in-process; ``(rc, stdout, stderr)``."""
    rc = export_tool.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_unknown_arch_is_one_line_with_rc_2(tmp_path):
    """As a user runs it: a subprocess, no traceback, one error line naming the valid archs."""
    out = subprocess.run([sys.executable, 'tools/export.py', SWIN_DET, '--out', str(tmp_path / 'x.onnx'),
                          '--cfg-options', 'model.backbone.arch=xxs'], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, TRACEBACK_ENV: ''})
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and 'Traceback' not in out.stderr, out.stderr[-2000:]
    assert "unknown arch 'xxs'" in errors[0] and "'tiny'" in errors[0] and "'small'" in errors[0]


def test_mistyped_keyword_and_type_suggest_the_valid_name(tmp_path, capsys):
    onnx = str(tmp_path / 'x.onnx')
    # --cfg-options itself refuses a key one letter off an existing one ...
    rc, _, err = _export(capsys, SWIN_DET, '--out', onnx, '--cfg-options', 'model.backbone.out_indice=[1]')
    assert rc == 2 and "did you mean 'model.backbone.out_indices'?" in err, err
    # ... and a key declared new on purpose (+KEY) that the class does not take gets the build-time hint
    rc, _, err = _export(capsys, SWIN_DET, '--out', onnx, '--cfg-options', '+model.backbone.out_indice=[1]')
    assert rc == 2 and err.startswith('error: ') and "out_indice" in err
    assert re.search(r"out_indice\b.*did you mean 'out_indices'", err), err
    # a class whose own __init__ rejects the keyword (Python's TypeError): the same hint
    rc, _, err = _export(capsys, DET, '--out', onnx, '--cfg-options', '+model.backbone.out_indice=[1]')
    assert rc == 2 and "unexpected keyword argument 'out_indice' (did you mean 'out_indices'?)" in err, err
    rc, _, err = _export(capsys, SWIN_DET, '--out', onnx, '--cfg-options',
                         'model.backbone.type=mmplugin.SwimTransformer')
    assert rc == 2 and 'mmplugin.SwimTransformer is not in the' in err, err
    assert "did you mean 'mmplugin.SwinTransformer'" in err and 'Please check' not in err, err
    assert not (tmp_path / 'x.onnx').exists()


def test_traceback_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv(TRACEBACK_ENV, '1')
    with pytest.raises(ValueError, match="unknown arch 'xxs'"):
        export_tool.main([DET, '--out', str(tmp_path / 'x.onnx'), '--cfg-options', 'model.backbone.arch=xxs'])


def test_missing_checkpoint_is_rc_2(tmp_path, capsys):
    rc, _, err = _export(capsys, DET, str(tmp_path / 'nope.pth'), '--out', str(tmp_path / 'x.onnx'))
    assert rc == 2 and err.strip() == f'error: checkpoint file not found: {tmp_path / "nope.pth"}'
    from mmplugin.apis import build_model
    from mmplugin.checkpoint import CheckpointNotFoundError
    from mmplugin.cli.common import user_error_message
    with pytest.raises(CheckpointNotFoundError) as info:  # the package raises; the tools print one line
        build_model(DET, str(tmp_path / 'nope.pth'))
    assert str(tmp_path / 'nope.pth') in user_error_message(info.value)


def test_closest_names():
    assert closest('out_indice', ['out_indices', 'in_channels', 'with_cp']) == ['out_indices']
    assert closest('XS', ['l1', 'l3', 's', 'xs'])[0] == 'xs'
    assert closest('completely_else', ['out_indices']) == []


def test_bugs_are_not_user_errors():
    from mmplugin.cli.common import tool_main

    @tool_main
    def broken(argv=None):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    with pytest.raises(TypeError):
        broken([])


# ------------------------------------------------------------------------------------------- strictness by part
@pytest.fixture(scope='module')
def backbone_only(tmp_path_factory):
    """A backbone-only file as tools/convert_checkpoint.py writes converted ImageNet weights (no ``backbone.``
    prefix), with weights unlike any fresh initialisation; returns ``(path, state_dict)``."""
    from mmplugin.apis import build_model
    torch.manual_seed(0)
    sd = {k: torch.randn_like(v) if v.is_floating_point() else v
          for k, v in build_model(DET).backbone.state_dict().items()}
    path = tmp_path_factory.mktemp('ckpt') / 'swiftformer_xs_imagenet.pth'
    torch.save({'state_dict': sd, 'meta': {'family': 'swiftformer'}}, path)
    return path, sd


def test_backbone_only_file_fits_the_backbone_part_only(backbone_only):
    from mmplugin.apis import build_model
    from mmplugin.checkpoint import CheckpointError
    path, sd = backbone_only
    model = build_model(DET, str(path), part='backbone')
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, sd[k]), k
    with pytest.raises(CheckpointError) as info:
        build_model(DET, str(path), part='backbone+neck')
    msg = str(info.value)
    assert 'the backbone+neck of' in msg and 'missing' in msg, msg
    first = msg.split('missing (first: ')[1].split(', ...')[0].split(', ')
    assert first and all(k.startswith('neck.lateral_convs.') for k in first), msg  # the neck's keys, nothing else
    with pytest.raises(CheckpointError, match='backbone weights only'):  # the whole model needs its heads too
        build_model(DET, str(path))


@pytest.mark.heavy
def test_export_backbone_with_a_backbone_only_file(backbone_only, tmp_path, capsys):
    path, _ = backbone_only
    onnx = tmp_path / 'backbone.onnx'
    rc, out, err = _export(capsys, DET, str(path), '--out', str(onnx), '--part', 'backbone', '--example', '2x64x64',
                           '--verify', '1x64x96')
    assert rc == 0, err
    assert onnx.is_file() and 'exported backbone' in out and re.search(r'1x3x64x96\s+\S+\s+ok', out), out
    rc, _, err = _export(capsys, DET, str(path), '--out', str(tmp_path / 'neck.onnx'), '--part', 'backbone+neck')
    assert rc == 2 and err.startswith('error: ') and 'neck.lateral_convs.' in err, err
    assert not (tmp_path / 'neck.onnx').exists()


# ------------------------------------------------------------------------------------------------ progress, load
def test_get_flops_reports_progress_per_model(capsys):
    rows = get_flops_tool.main(['--family', 'swiftformer', '--arch', 'xs', 's', '--sizes', '32'])
    err = capsys.readouterr().err.splitlines()
    assert [r[0] for r in rows] == ['swiftformer-xs', 'swiftformer-s']
    assert len(err) == 2 and re.fullmatch(r'\[1/2\] swiftformer-xs: \d+\.\d s', err[0]), err
    assert re.fullmatch(r'\[2/2\] swiftformer-s: \d+\.\d s', err[1]), err


def test_load_warning(monkeypatch):
    # 2 cores, timing with 2 threads: any other runnable process competes (the load counts this one too)
    assert load_warning(2, load=3.5, cores=2) is not None and 'load average 3.5' in load_warning(2, load=3.5, cores=2)
    assert load_warning(2, load=1.2, cores=2) is None
    # 16 cores, 4 threads: 6 other runnable processes still leave the timed cores free
    assert load_warning(4, load=7.0, cores=16) is None
    assert load_warning(4, load=14.0, cores=16) is not None
    monkeypatch.setattr(os, 'getloadavg', lambda: (9.0, 1.0, 1.0))
    assert 'load average 9.0' in load_warning(1, cores=4)
    monkeypatch.setattr(os, 'getloadavg', lambda: (_ for _ in ()).throw(OSError('no load average')))
    assert load_warning(1, cores=4) is None


def test_benchmark_warns_on_a_loaded_machine(monkeypatch, capsys):
    import mmplugin.cli.benchmark as benchmark_tool
    monkeypatch.setattr(os, 'getloadavg', lambda: (64.0, 64.0, 64.0))
    res = benchmark_tool.main(['swinv2', '--arch', 'tiny', '--sizes', '32x32', '--rounds', '1', '--threads', '1'])
    assert 'warning: the machine is loaded (load average 64.0' in capsys.readouterr().err
    assert res['sizes']['32x32']['mmplugin'] > 0


@pytest.mark.heavy
def test_peak_memory_runs_in_a_fresh_process():
    """``python -m mmplugin.analysis.memory`` (what ``tools/benchmark.py --memory`` runs per model): the growth of
    the process's peak RSS over a training step; 9x the pixels need more than twice the memory (activations)."""
    from mmplugin.analysis import peak_memory
    small = peak_memory('swinv2', 'tiny', 'mmplugin', (128, 128), False, 'cpu', timeout=600)
    large = peak_memory('swinv2', 'tiny', 'mmplugin', (384, 384), False, 'cpu', timeout=600)
    assert 0 < small and large > 2 * small, (small, large)
