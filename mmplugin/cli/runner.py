"""Config preparation shared by tools/train.py and tools/test.py."""
from __future__ import annotations

import glob
import logging
import os
import os.path as osp
import re
import zipfile
from contextlib import contextmanager

import torch

__all__ = ['build_runner', 'find_resumable_checkpoint', 'prepare_amp', 'prepare_runner_cfg']


def _problem(path: str) -> str | None:
    """Why ``path`` cannot be resumed from (``None``: it is a complete checkpoint archive).

    Atomic saves make every file this plugin wrote complete; files copied or written by other tools may still be
    truncated, empty or not checkpoints at all. Checks zip CRCs, without unpickling.
    """
    from mmplugin.checkpoint import describe_file
    if osp.isdir(path):  # a sharded FSDP checkpoint: one complete rank<i>.pth per rank, numbered from 0
        ranks = sorted(int(m.group(1)) for f in os.listdir(path) if (m := re.fullmatch(r'rank(\d+)\.pth', f)))
        if not ranks or ranks != list(range(len(ranks))):
            return f'a folder without rank0.pth .. rankN.pth (found ranks {ranks})'
        problems = [f'rank{r}.pth: {why}' for r in ranks if (why := _problem(osp.join(path, f'rank{r}.pth')))]
        return '; '.join(problems) or None
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is None:
            return None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        pass
    try:
        looks = describe_file(path)
    except OSError as err:
        return f'unreadable: {err}'
    return looks[0] if looks else 'not a complete checkpoint archive'


def find_resumable_checkpoint(work_dir: str, skipped: list[str] | None = None) -> str | None:
    """The newest intact checkpoint in ``work_dir``: the ``last_checkpoint`` pointer if it names an intact file,
    else the highest-numbered intact ``epoch_*.pth`` / ``iter_*.pth``.

    Args:
        work_dir: the training work dir.
        skipped: if given, ``'<name> (<what it looks like>)'`` is appended for every newer checkpoint passed over.
    """
    skipped = [] if skipped is None else skipped
    seen = set()
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            path = f.read().strip()
        if path and not osp.isabs(path):
            path = osp.join(work_dir, osp.basename(path))
        if path and osp.exists(path):  # a file, or the folder of a sharded FSDP checkpoint
            problem = _problem(path)
            if problem is None:
                return path
            skipped.append(f'{osp.basename(path)} ({problem})')
            seen.add(osp.abspath(path))
    cands = []
    for p in glob.glob(osp.join(work_dir, '*.pth')):  # files, and folders of sharded FSDP checkpoints
        m = re.match(r'(epoch|iter)_(\d+)\.pth$', osp.basename(p))
        if m:
            cands.append((int(m.group(2)), p))
    for _, p in sorted(cands, reverse=True):
        if osp.abspath(p) in seen:
            continue
        problem = _problem(p)
        if problem is None:
            return p
        skipped.append(f'{osp.basename(p)} ({problem})')
    return None


def _check_resume_path(resume: str) -> None:
    """Fail before any model is built when ``--resume PATH`` cannot be loaded (missing, text, HTML, ...)."""
    from mmplugin.checkpoint import CheckpointError, load_checkpoint_file
    if osp.isdir(resume):  # a sharded FSDP checkpoint: every rank's file must be complete
        problem = _problem(resume)
        if problem:
            raise CheckpointError(f'--resume {resume}: not a complete sharded checkpoint ({problem})')
        return
    load_checkpoint_file(resume)  # raises CheckpointError (CheckpointNotFoundError for a missing file)


def _clean_work_dir(work_dir: str) -> None:
    from mmplugin.checkpoint import remove_stale_temporary_files
    removed = remove_stale_temporary_files(work_dir, at_resume=True)
    if removed:
        print(f'removed {len(removed)} temporary file(s) of interrupted saves: {", ".join(removed)}')


def prepare_amp(cfg, amp: bool, dtype: str | None = None) -> None:
    """Mixed precision from ``--amp`` / ``--amp-dtype`` or the config's ``AmpOptimWrapper``, on any device.

    With CUDA: mmengine's ``AmpOptimWrapper``. Without: ``mmplugin.AmpOptimWrapper`` (the same arguments and
    checkpoint state; mmengine's refuses to start without an accelerator), so an AMP config trains on the CPU in
    the precision it names instead of silently in fp32. ``dtype`` ('float16' / 'bfloat16') overrides the config's.
    """
    optim = cfg.get('optim_wrapper')
    if optim is None or not (amp or dtype or optim.get('type') in ('AmpOptimWrapper', 'mmplugin.AmpOptimWrapper')):
        return
    if optim.get('type') not in (None, 'OptimWrapper', 'AmpOptimWrapper', 'mmplugin.AmpOptimWrapper'):
        raise ValueError(f"--amp: the config's optim_wrapper type {optim.get('type')!r} is not an OptimWrapper; set "
                         "optim_wrapper.type='AmpOptimWrapper' in the config instead")
    if optim.get('type') in (None, 'OptimWrapper'):
        optim.setdefault('loss_scale', 'dynamic')
    optim.type = 'AmpOptimWrapper' if torch.cuda.is_available() else 'mmplugin.AmpOptimWrapper'
    if dtype:
        optim.dtype = dtype
    if optim.type == 'mmplugin.AmpOptimWrapper':
        from mmplugin.engine import default_amp_dtype
        name = optim.get('dtype') or str(default_amp_dtype('cpu')).replace('torch.', '')
        print(f'mixed precision on the CPU: mmplugin.AmpOptimWrapper, {name} autocast'
              + (' with dynamic loss scaling' if name == 'float16' else ''))


def prepare_runner_cfg(cfg, args) -> None:
    """Apply the common command-line options to ``cfg`` in place (work_dir, launcher, AMP, resume)."""
    if getattr(args, 'work_dir', None):
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    cfg.launcher = getattr(args, 'launcher', 'none')
    vis = cfg.get('visualizer')
    if isinstance(vis, dict) and vis.get('name') == 'visualizer':
        # mmdet's / mmseg's default_runtime call every visualizer 'visualizer', and mmengine hands back an existing
        # instance of that name (with the first run's save_dir): a second run in the same process would log its
        # scalars into the first run's folder. Unnamed, the runner names it after the run.
        vis.pop('name')
    from mmplugin.engine.ddp import setup_cpu_distributed
    setup_cpu_distributed(cfg)
    prepare_amp(cfg, getattr(args, 'amp', False), getattr(args, 'amp_dtype', None))
    resume = getattr(args, 'resume', None)
    if resume == 'auto':
        skipped: list[str] = []
        found = find_resumable_checkpoint(cfg.work_dir, skipped) if osp.isdir(cfg.work_dir) else None
        if osp.isdir(cfg.work_dir):
            _clean_work_dir(cfg.work_dir)
        if skipped:
            print(f'resume: skipped {len(skipped)} unreadable checkpoint(s), newest first: {"; ".join(skipped)}')
        cfg.resume = found is not None
        cfg.load_from = found if found else cfg.get('load_from')
        if found:
            print(f'resuming from {found}')
        else:
            print(f'no checkpoint to resume from in {cfg.work_dir}; starting from scratch')
    elif resume:
        _check_resume_path(resume)
        if osp.isdir(cfg.work_dir):
            _clean_work_dir(cfg.work_dir)
        cfg.resume = True
        cfg.load_from = resume
    os.makedirs(cfg.work_dir, exist_ok=True)


def build_runner(cfg):
    """mmengine's ``Runner``, or the runner that ``cfg.runner_type`` names (``'FlexibleRunner'`` for FSDP through
    ``strategy=dict(type='FSDPStrategy')``), built from ``cfg``.

    The environment and config dump mmengine prints while it builds the runner (~480 lines) goes to the run's log
    file only; the console gets one line naming that file, so a mistake found next is the first thing a user sees.
    """
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    cls = Runner if 'runner_type' not in cfg else RUNNERS.get(cfg.runner_type)
    with _environment_dump_to_log_file(cls if isinstance(cls, type) else Runner):
        if 'runner_type' not in cfg:
            return Runner.from_cfg(cfg)
        return RUNNERS.build(cfg)


class _NotOnConsole(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextmanager
def _environment_dump_to_log_file(runner_cls):
    original = runner_cls._log_env

    def log_env(self, *args, **kwargs):  # Runner._log_env(env_cfg), FlexibleRunner._log_env()
        console = [h for h in self.logger.handlers
                   if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
        quiet = _NotOnConsole()
        for h in console:
            h.addFilter(quiet)
        try:
            original(self, *args, **kwargs)
        finally:
            for h in console:
                h.removeFilter(quiet)
        log_file = getattr(self.logger, 'log_file', None)
        if console and log_file:
            print(f'environment and config: {log_file}', flush=True)

    runner_cls._log_env = log_env
    try:
        yield
    finally:
        runner_cls._log_env = original
