"""Config preparation shared by tools/train.py and tools/test.py."""
from __future__ import annotations

import glob
import os
import os.path as osp
import re
import warnings
import zipfile

import torch

__all__ = ['find_resumable_checkpoint', 'prepare_runner_cfg']


def _intact(path: str) -> bool:
    """A checkpoint file is complete (zip CRCs verify). Atomic saves make this true for every file we wrote;
    files copied or written by other tools may still be truncated."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


def find_resumable_checkpoint(work_dir: str) -> str | None:
    """The newest intact checkpoint in ``work_dir``: the ``last_checkpoint`` pointer if it names an intact file,
    else the highest-numbered intact ``epoch_*.pth`` / ``iter_*.pth``."""
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            path = f.read().strip()
        if path and not osp.isabs(path):
            path = osp.join(work_dir, osp.basename(path))
        if path and osp.isfile(path) and _intact(path):
            return path
    cands = []
    for p in glob.glob(osp.join(work_dir, '*.pth')):
        m = re.match(r'(epoch|iter)_(\d+)\.pth$', osp.basename(p))
        if m:
            cands.append((int(m.group(2)), p))
    for _, p in sorted(cands, reverse=True):
        if _intact(p):
            return p
    return None


def prepare_runner_cfg(cfg, args) -> None:
    """Apply the common command-line options to ``cfg`` in place (work_dir, launcher, AMP, resume)."""
    if getattr(args, 'work_dir', None):
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    cfg.launcher = getattr(args, 'launcher', 'none')
    from .ddp import setup_cpu_distributed
    setup_cpu_distributed(cfg)
    has_accel = torch.cuda.is_available()
    optim = cfg.get('optim_wrapper')
    if getattr(args, 'amp', False) and optim is not None:
        if has_accel:
            optim.type = 'AmpOptimWrapper'
            optim.setdefault('loss_scale', 'dynamic')
        else:
            warnings.warn('--amp needs a GPU (mmengine AmpOptimWrapper); training in fp32 on the CPU')
    if optim is not None and optim.get('type') == 'AmpOptimWrapper' and not has_accel:
        warnings.warn('the config uses AmpOptimWrapper but no GPU is available; training in fp32')
        optim.type = 'OptimWrapper'
        optim.pop('loss_scale', None)
        optim.pop('dtype', None)
    resume = getattr(args, 'resume', None)
    if resume == 'auto':
        found = find_resumable_checkpoint(cfg.work_dir) if osp.isdir(cfg.work_dir) else None
        cfg.resume = found is not None
        cfg.load_from = found if found else cfg.get('load_from')
        if found:
            print(f'resuming from {found}')
        else:
            print(f'no checkpoint to resume from in {cfg.work_dir}; starting from scratch')
    elif resume:
        if not osp.isfile(resume):
            raise FileNotFoundError(f'--resume {resume!r}: no such checkpoint file')
        cfg.resume = True
        cfg.load_from = resume
    os.makedirs(cfg.work_dir, exist_ok=True)
