"""Environment setup decisions of tools/mmcv_ops.py (loaded by path: it runs before the package is installed):
CPU or CUDA ops from torch's build, the visible GPU and nvcc; CPU-only mmcv wheels never reused where CUDA ops are
needed; the installed mmcv's compiled ops classified from the extension's own bytes and verified."""
from __future__ import annotations

import runpy
import types
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _mmcv_ops():
    """tools/mmcv_ops.py's functions (it runs before the package is installed, so it is not part of it)."""
    return types.SimpleNamespace(**runpy.run_path(str(ROOT / 'tools' / 'mmcv_ops.py'), run_name='mmcv_ops'))


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
    wheel = f"{ops.MMCV_DIST.replace('-', '_')}-{ops.MMCV_VERSION}"  # the stack's mmcv (MMPLUGIN_STACK)
    cpu_dir, cuda_dir = tmp_path / 'torch-cp311', tmp_path / 'torch-cp311-cudaops'
    cpu_dir.mkdir()
    cuda_dir.mkdir()
    cpu = _fake_wheel(cpu_dir / f'{wheel}-cp311-cp311-linux_x86_64.whl', b'\x7fELF libtorch_cpu.so libc10.so')
    lite = _fake_wheel(tmp_path / f'{wheel}-py3-none-any.whl', None)
    assert ops.wheel_ops(str(cpu)) == 'cpu' and ops.wheel_ops(str(lite)) == 'none'
    refused = []
    assert ops.pick_wheel('cuda', [str(cpu_dir)], log=refused.append) is None
    assert 'CPU-only compiled ops' in refused[0] and 'CUDA ops are needed' in refused[0]
    assert ops.pick_wheel('cpu', [str(cpu_dir)]) == str(cpu)
    cuda = _fake_wheel(cuda_dir / f'{wheel}-cp311-cp311-linux_x86_64.whl',
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
