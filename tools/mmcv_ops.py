"""Decisions of tools/setup_env.sh about mmcv's compiled ops, as small testable functions.

mmcv compiles its CUDA ops only when a GPU is visible at build time or ``FORCE_CUDA=1`` is set. A wheel built
where no GPU is visible (a cluster login node, a container build) has CPU ops only; cached and reused on a GPU
node, RoIAlign / NMS then fail at the first training step. So the wheel cache records which ops a wheel has, a
CPU-only wheel is not reused where CUDA ops are needed, and a GPU without a CUDA compiler stops before the build.

    python tools/mmcv_ops.py plan                 # prints 'cuda' or 'cpu' (the ops to build); exit 3 + message if
                                                  # they cannot be built here
    python tools/mmcv_ops.py wheel-ops WHEEL      # prints 'cuda', 'cpu' or 'none' (what the wheel contains)
    python tools/mmcv_ops.py pick-wheel NEED DIR...  # prints a cached wheel with the NEEDed ops, or nothing
    python tools/mmcv_ops.py verify               # exit 0 if mmcv's ops run (on CUDA tensors too when a GPU is
                                                  # visible), else 1 with the reason

Runs with the venv's interpreter; needs only the standard library except for ``plan`` and ``verify`` (torch).
"""
from __future__ import annotations

import glob
import os
import os.path as osp
import re
import subprocess
import sys
import zipfile

# the stack's mmcv distribution (MMPLUGIN_STACK: openmmlab -> mmcv, onedl -> onedl-mmcv) and its tested version, read
# from the stack's constraints file (requirements/<stack>.txt), the one place that names it
STACK = os.environ.get('MMPLUGIN_STACK', 'openmmlab')
MMCV_DIST = 'onedl-mmcv' if STACK == 'onedl' else 'mmcv'


def _pinned(dist: str) -> str:
    path = osp.join(osp.dirname(osp.abspath(__file__)), '..', 'requirements', f'{STACK}.txt')
    with open(path) as f:
        for line in f:
            name, _, version = line.strip().partition('==')
            if name == dist:
                return version
    raise SystemExit(f'{path} does not pin {dist}')


MMCV_VERSION = _pinned(MMCV_DIST)
# Shared libraries that only a CUDA build of mmcv's extension links against (names kept in the ELF / PE file).
_CUDA_MARKERS = (b'libcudart', b'libc10_cuda', b'libtorch_cuda', b'cudart64_')


class SetupError(Exception):
    """Setup cannot continue; the message says why and what to do."""


def wheel_ops(wheel: str) -> str:
    """``'cuda'`` if the wheel's ``mmcv/_ext`` links CUDA libraries, ``'cpu'`` if it has CPU ops only, ``'none'``
    if it has no compiled ops (mmcv-lite) or cannot be read."""
    try:
        with zipfile.ZipFile(wheel) as z:
            exts = [n for n in z.namelist() if re.match(r'mmcv/_ext[^/]*\.(so|pyd)$', n)]
            if not exts:
                return 'none'
            data = z.read(exts[0])
    except (OSError, zipfile.BadZipFile):
        return 'none'
    return 'cuda' if any(m in data for m in _CUDA_MARKERS) else 'cpu'


def pick_wheel(need: str, folders: list[str], log=None) -> str | None:
    """The first cached mmcv wheel in ``folders`` that has the ``need``ed ops (a CUDA-ops wheel also serves CPU).

    Wheels are inspected, not trusted by their folder name, so wheels cached by older versions of the setup
    script (one folder per torch version, whatever the ops) are checked the same way.
    """
    for folder in folders:
        for whl in sorted(glob.glob(osp.join(folder, f"{MMCV_DIST.replace('-', '_')}-{MMCV_VERSION}-*.whl"))):
            ops = wheel_ops(whl)
            if ops == 'cuda' or (ops == 'cpu' and need == 'cpu'):
                return whl
            if log is not None:
                log(f'not reusing {whl}: it has {"no" if ops == "none" else "CPU-only"} compiled ops '
                    f'(built where no GPU was visible) and {need.upper()} ops are needed')
    return None


def plan(torch_version: str, torch_cuda: str | None, gpu_visible: bool, force_cuda: bool,
         nvcc: str | None, nvcc_release: str | None = None) -> tuple[str, list[str]]:
    """Which ops the mmcv build must have here: ``('cuda' | 'cpu', warnings)``; raises :class:`SetupError`.

    Args:
        torch_version, torch_cuda: ``torch.__version__`` and ``torch.version.cuda`` (``None``: CPU-only torch).
        gpu_visible: ``torch.cuda.is_available()``.
        force_cuda: ``FORCE_CUDA=1`` (mmcv's switch to compile CUDA ops without a visible GPU).
        nvcc: path of the CUDA compiler torch's extension builder would use, or ``None``.
        nvcc_release: its version, e.g. ``'12.1'``, when known.
    """
    if force_cuda and torch_cuda is None:
        raise SetupError(f'FORCE_CUDA=1 but torch {torch_version} is a CPU-only build, so mmcv cannot get CUDA ops. '
                         'Install a CUDA build of torch first (README, "Supported torch / CUDA"), or unset '
                         'FORCE_CUDA for a CPU-only environment.')
    if torch_cuda is None:
        return 'cpu', []
    if not (gpu_visible or force_cuda):
        return 'cpu', [f'torch {torch_version} is a CUDA {torch_cuda} build but no GPU is visible here: mmcv is '
                       'built with CPU ops only, and RoIAlign / NMS will fail on GPUs. If this environment is '
                       'used on GPU nodes, rerun with FORCE_CUDA=1 (needs nvcc for CUDA '
                       f'{torch_cuda}), or run this script on a GPU node.']
    why = 'a GPU is visible' if gpu_visible else 'FORCE_CUDA=1 is set'
    if nvcc is None:
        raise SetupError(
            f'{why}, so mmcv {MMCV_VERSION} must be compiled with CUDA ops for torch {torch_version} '
            f'(CUDA {torch_cuda}), but no CUDA compiler (nvcc) was found. Either install the CUDA toolkit '
            f'{torch_cuda} (e.g. `conda install -c nvidia cuda-toolkit={torch_cuda}`, '
            'or NVIDIA\'s installer, or `module load cuda` on a cluster) and export '
            f'CUDA_HOME=/path/to/cuda-{torch_cuda} (containing bin/nvcc), or build CPU-only ops on purpose with no '
            'GPU visible: CUDA_VISIBLE_DEVICES= bash tools/setup_env.sh (then mmcv\'s detection ops run on the CPU '
            'only).')
    if nvcc_release and nvcc_release.split('.')[0] != torch_cuda.split('.')[0]:
        raise SetupError(f'nvcc at {nvcc} is CUDA {nvcc_release} but torch {torch_version} was built with CUDA '
                         f'{torch_cuda}; the major versions must match. Point CUDA_HOME to a CUDA {torch_cuda} '
                         'toolkit, or install the torch build for your CUDA (README, "Supported torch / CUDA").')
    return 'cuda', []


def _probe() -> dict:
    """What :func:`plan` needs, read from the running interpreter's torch and the environment."""
    import torch
    info = dict(torch_version=torch.__version__, torch_cuda=torch.version.cuda,
                gpu_visible=bool(torch.version.cuda) and torch.cuda.is_available(),
                force_cuda=os.environ.get('FORCE_CUDA', '0') == '1', nvcc=None, nvcc_release=None)
    if torch.version.cuda:
        from torch.utils.cpp_extension import CUDA_HOME
        nvcc = osp.join(CUDA_HOME, 'bin', 'nvcc') if CUDA_HOME else None
        if nvcc and osp.isfile(nvcc):
            info['nvcc'] = nvcc
            try:
                out = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60).stdout
                m = re.search(r'release (\d+\.\d+)', out)
                info['nvcc_release'] = m.group(1) if m else None
            except (OSError, subprocess.SubprocessError):
                pass
    return info


def verify() -> str | None:
    """Run mmcv's NMS and RoIAlign on CPU tensors, and on CUDA tensors when a GPU is visible; ``None`` if they
    work, else the reason."""
    try:
        import mmcv
        import torch
        from mmcv.ops import RoIAlign, nms
    except Exception as err:  # noqa: BLE001  any import failure means the ops are unusable
        return f'mmcv ops do not import: {type(err).__name__}: {err}'
    if mmcv.__version__ != MMCV_VERSION:
        return f'mmcv {mmcv.__version__} is installed, {MMCV_DIST} {MMCV_VERSION} is needed'
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    for dev in devices:
        try:
            boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]], device=dev)
            keep = nms(boxes, torch.tensor([0.9, 0.8], device=dev), 0.5)[1]
            feats = torch.arange(64., device=dev).reshape(1, 1, 8, 8)
            rois = torch.tensor([[0., 0., 0., 4., 4.]], device=dev)
            pooled = RoIAlign((2, 2), 1.0, 2)(feats, rois)
            if keep.tolist() != [0] or pooled.shape != (1, 1, 2, 2) or not torch.isfinite(pooled).all():
                return f'mmcv ops give wrong results on {dev}'
        except Exception as err:  # noqa: BLE001
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            if dev == 'cuda':
                return (f'mmcv ops fail on CUDA tensors ({first}): the installed mmcv was built without CUDA ops '
                        '(no GPU visible at build time)')
            return f'mmcv ops fail on {dev} ({first})'
    return None


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ''
    if cmd == 'plan':
        try:
            ops, warnings = plan(**_probe())
        except SetupError as err:
            print(f'[setup] ERROR: {err}', file=sys.stderr)
            return 3
        for w in warnings:
            print(f'[setup] WARNING: {w}', file=sys.stderr)
        print(ops)
        return 0
    if cmd == 'wheel-ops' and len(argv) == 2:
        print(wheel_ops(argv[1]))
        return 0
    if cmd == 'pick-wheel' and len(argv) >= 3 and argv[1] in ('cpu', 'cuda'):
        whl = pick_wheel(argv[1], argv[2:], log=lambda m: print(f'[setup] {m}', file=sys.stderr))
        if whl:
            print(whl)
        return 0
    if cmd == 'verify':
        problem = verify()
        if problem:
            print(f'[setup] {problem}', file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
