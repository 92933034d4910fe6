"""``python -m build`` gives an sdist and a wheel that ship the configs; the wheel (and an editable
install) go into a clean venv and pass a smoke test that inherits ``mmplugin::swin/swin_t_maskrcnn_1x_coco.py``.

The clean venv is made with ``python -m venv --without-pip`` and sees the test interpreter's site-packages through a
``.pth`` file (appended after its own site-packages, so its own ``mmplugin`` wins). Not ``--system-site-packages``:
that exposes the base interpreter's packages, not this environment's torch / mmcv-with-ops / mmdet / mmseg, and
installing those from an index needs the network (and a 10-15 minute mmcv build). So the wheel is installed with
``--no-deps --no-index``, and the smoke test checks instead that every requirement the wheel declares is satisfied
by what the venv sees. Nothing is downloaded: the build runs with ``--no-isolation``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

# Run inside the clean venv, from a folder outside the repository. Prints one JSON line.
SMOKE = r'''
import importlib.metadata as md, json, sys
from pathlib import Path
from packaging.requirements import Requirement

import torch
import mmplugin
from mmengine.config import Config
from mmdet.registry import MODELS as DET
from mmseg.registry import MODELS as SEG

report = {'mmplugin': str(Path(mmplugin.__file__).resolve().parent), 'version': mmplugin.__version__}
unmet = []
for line in md.requires('mmplugin') or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({'extra': ''}):
        continue  # extras (tests)
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(f'{req} (missing)')
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        unmet.append(f'{req} (have {have})')
report['unmet'] = unmet

x = torch.rand(1, 3, 64, 96)
swin = DET.build(dict(type='mmplugin.SwinTransformer', arch=dict(embed_dims=16, depths=[1, 1, 1, 1],
                                                                  num_heads=[1, 2, 2, 4]), window_size=4))
swift = SEG.build(dict(type='mmplugin.SwiftFormer', arch='xs'))
report['swin'] = [list(o.shape) for o in swin.eval()(x)]
report['swift'] = [list(o.shape) for o in swift.eval()(x)]

cfg = Config.fromfile(sys.argv[1])
report['num_classes'] = cfg.model.roi_head.bbox_head.num_classes
report['backbone'] = cfg.model.backbone.type
report['base'] = str(mmplugin.config_file('swin/swin_t_maskrcnn_1x_coco.py'))
report['base_is_link'] = (Path(mmplugin.__file__).parent / '.mim' / 'configs').is_symlink()
print(json.dumps(report))
'''

USER_CONFIG = """
_base_ = ['mmplugin::swin/swin_t_maskrcnn_1x_coco.py']
model = dict(roi_head=dict(bbox_head=dict(num_classes=5), mask_head=dict(num_classes=5)))
"""


def _run(args, cwd, timeout=600, env=None):
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != 'PYTHONPATH'}
    out = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f'{args} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}'
    return out


def _source_copy(dst: Path) -> Path:
    """The repository as a fresh clone would have it (tracked and new unignored files), so builds leave no trace
    in the working tree and see only what a clone has."""
    files = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split('\0')
    for rel in filter(None, files):
        src, out = ROOT / rel, dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, out)
    return dst


def _clean_venv(path: Path) -> Path:
    """A venv without pip or packages of its own that can import this environment's dependencies."""
    _run([PY, '-m', 'venv', '--without-pip', path], cwd=path.parent, timeout=120)
    py = path / 'bin' / 'python'
    site = Path(_run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                     cwd=path).stdout.strip())
    ours = {sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']}
    (site / 'zz_test_env.pth').write_text(''.join(f'{p}\n' for p in sorted(ours)))
    return py


def _pip_install(py: Path, *args):
    # --ignore-installed: the mmplugin this environment has (seen through the .pth) is neither replaced nor removed
    _run([PY, '-m', 'pip', '--python', py, 'install', '--no-deps', '--no-index', '--no-build-isolation',
          '--ignore-installed', '-q', *args], cwd=py.parent, timeout=600)


def _smoke(py: Path, tmp: Path) -> dict:
    project = tmp / 'user_project'
    project.mkdir()
    (project / 'smoke.py').write_text(SMOKE)
    (project / 'my_cfg.py').write_text(textwrap.dedent(USER_CONFIG))
    out = _run([py, '-I', project / 'smoke.py', project / 'my_cfg.py'], cwd=project)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_report(report: dict) -> None:
    assert report['unmet'] == [], report['unmet']
    assert report['swin'] == [[1, 16, 16, 24], [1, 32, 8, 12], [1, 64, 4, 6], [1, 128, 2, 3]]
    assert report['swift'] == [[1, 48, 16, 24], [1, 56, 8, 12], [1, 112, 4, 6], [1, 220, 2, 3]]
    assert report['num_classes'] == 5 and report['backbone'] == 'mmplugin.SwinTransformer'


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    src = _source_copy(tmp_path_factory.mktemp('src'))
    dist = tmp_path_factory.mktemp('dist')
    _run([PY, '-m', 'build', '--no-isolation', '--outdir', dist, src], cwd=src, timeout=600)
    return src, next(dist.glob('*.tar.gz')), next(dist.glob('*.whl'))


def test_sdist_and_wheel_ship_every_config(built):
    src, sdist, wheel = built
    configs = sorted(p.relative_to(ROOT / 'configs').as_posix() for p in (ROOT / 'configs').rglob('*.py'))
    assert len(configs) > 30 and '_base_/swin_maskrcnn.py' in configs
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        shipped = sorted(n.split('mmplugin/.mim/configs/', 1)[1] for n in names
                         if '/.mim/configs/' in n and n.endswith('.py'))
        assert z.read('mmplugin/.mim/configs/swin/swin_t_maskrcnn_1x_coco.py') == \
            (ROOT / 'configs' / 'swin/swin_t_maskrcnn_1x_coco.py').read_bytes()
        # the model index and its metafiles, for `mim search mmplugin` (mmplugin/zoo.py)
        assert z.read('mmplugin/.mim/model-index.yml') == (ROOT / 'model-index.yml').read_bytes()
        configs_dir = ROOT / 'configs'
        metafiles = sorted(p.relative_to(configs_dir).as_posix() for p in configs_dir.glob('*/metafile.yml'))
        assert metafiles and all(f'mmplugin/.mim/configs/{m}' in names for m in metafiles)
        # the C kernel sources, built on first use (mmplugin/ops/build.py)
        kernels = sorted(p.name for p in (ROOT / 'mmplugin/ops').glob('*.[ch]'))
        assert kernels and all(z.read(f'mmplugin/ops/{k}') == (ROOT / 'mmplugin/ops' / k).read_bytes()
                               for k in kernels)
    assert shipped == configs
    assert not any(n.startswith(('tests/', 'configs/')) for n in names)
    with tarfile.open(sdist) as t:
        members = {m.name.split('/', 1)[1]: m for m in t.getmembers() if '/' in m.name}
    link = members['mmplugin/.mim/configs']
    assert link.isdir(), 'the sdist must hold the config files, not the link'
    assert all(f'mmplugin/.mim/configs/{c}' in members for c in configs)
    assert members['mmplugin/.mim/model-index.yml'].isfile(), 'the sdist must hold the model index, not the link'


def test_wheel_in_a_clean_venv(built, tmp_path):
    _, _, wheel = built
    py = _clean_venv(tmp_path / 'venv')
    _pip_install(py, wheel)
    report = _smoke(py, tmp_path)
    _check_report(report)
    site = Path(_run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                     cwd=tmp_path).stdout.strip())
    assert Path(report['mmplugin']) == (site / 'mmplugin').resolve()  # the wheel's copy, not the repository's
    assert Path(report['base']) == (site / 'mmplugin/.mim/configs/swin/swin_t_maskrcnn_1x_coco.py').resolve()
    assert not report['base_is_link']


def test_editable_install_in_a_clean_venv(tmp_path):
    src = _source_copy(tmp_path / 'src')
    py = _clean_venv(tmp_path / 'venv')
    _pip_install(py, '-e', src)
    report = _smoke(py, tmp_path)
    _check_report(report)
    assert Path(report['mmplugin']) == (src / 'mmplugin').resolve()
    assert Path(report['base']) == (src / 'configs/swin/swin_t_maskrcnn_1x_coco.py').resolve()  # the checkout's
