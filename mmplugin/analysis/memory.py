"""Peak memory of one training step (forward + backward, batch 2) of one benchmark model, measured in a fresh
process so that no other model's allocations count: on CPU the growth of the RSS high-water mark over the step (reset
before it on Linux, so building the models does not hide a small step's peak) with every large block mapped and
unmapped as it is allocated and freed (:func:`child_env`), ``max_memory_allocated`` on CUDA.

:func:`peak_memory` runs ``python -m mmplugin.analysis.memory FAMILY ARCH NAME HxW WITH_CP DEVICE`` and reads the
JSON line it prints.
"""
from __future__ import annotations

import json
import subprocess
import sys

import torch

__all__ = ['peak_memory', 'measure_peak_memory', 'peak_in_subprocess', 'child_env', 'rss_growth_mib',
           'enable_checkpointing', 'supports_checkpointing', 'MMAP_THRESHOLD']


def supports_checkpointing(model: torch.nn.Module) -> bool:
    """Whether the model has activation checkpointing (the plugin's switch, or OpenMMLab's ``with_cp`` on the model
    or on its blocks: mmdet's Swin keeps it on the blocks only)."""
    return hasattr(model, 'set_grad_checkpointing') or any(hasattr(m, 'with_cp') for m in model.modules())


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Turn on activation checkpointing: the plugin's ``set_grad_checkpointing``, else every block's ``with_cp``
    (OpenMMLab backbones read their blocks' flags)."""
    if hasattr(model, 'set_grad_checkpointing'):
        model.set_grad_checkpointing(True)
    else:
        for m in model.modules():
            if hasattr(m, 'with_cp'):
                m.with_cp = True


def _status_kib(field: str) -> int | None:
    """``VmRSS`` / ``VmHWM`` of this process in KiB (Linux), None elsewhere."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Set this process's RSS high-water mark to its current RSS (Linux ``clear_refs`` 5), so that the peak of
    what follows is measured, not the peak of building the models before it."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return _status_kib('VmHWM') is not None


def measure_peak_memory(family: str, arch: str, name: str, size: tuple[int, int], with_cp: bool,
                        device: str) -> float:
    """In this process: one training step of benchmark model ``name``; its peak memory in MiB."""
    import resource

    from mmplugin.analysis.peers import benchmark_models
    dev = torch.device(device)
    models = benchmark_models(family, arch, dev)
    model = models.pop(name)
    model.train()
    if with_cp:
        enable_checkpointing(model)
    x = torch.randn(2, 3, *size, device=dev)
    for m in models.values():
        m.cpu()
    del models
    reset = dev.type == 'cpu' and _reset_peak_rss()
    base = _status_kib('VmRSS') if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if dev.type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    outs = model(x)
    sum(o.float().mean() for o in outs).backward()
    if dev.type == 'cuda':
        return torch.cuda.max_memory_allocated() / 2**20
    peak = _status_kib('VmHWM') if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak - base) / 1024


def peak_memory(family: str, arch: str, name: str, size: tuple[int, int], with_cp: bool,
                device: torch.device | str, timeout: float = 1800) -> float:
    """:func:`measure_peak_memory` in a fresh subprocess (MiB)."""
    return peak_in_subprocess('mmplugin.analysis.memory', [family, arch, name, f'{size[0]}x{size[1]}',
                                                           str(int(bool(with_cp))), str(device)], timeout)


# glibc's initial mmap threshold, fixed: every block of 128 KiB or more is mapped when allocated and unmapped when
# freed, so the RSS follows the live allocations
MMAP_THRESHOLD = 128 * 1024


def child_env() -> dict[str, str]:
    """The environment of a measuring child process: this process's, with its torch thread count
    (``OMP_NUM_THREADS``) and glibc's mmap threshold fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``, no
    ``MALLOC_MMAP_MAX_`` / ``MALLOC_TRIM_THRESHOLD_``), so that the child's peak RSS growth is the peak of what the
    step keeps allocated, as ``max_memory_allocated`` is on CUDA.

    Why fixed: glibc raises its threshold after freeing large blocks and then serves them from a heap that fragments,
    and a retained heap (``--retain-memory``) keeps every freed block. Either way the same step's peak varied by
    10%: Swin-T's plugin step (batch 2, 512x768, fp32) gave 1513-1706 MiB with glibc's defaults and 1615-1766 MiB
    heap-only over a few runs, mmdet's 2006-2026 and 2061-2276; with the threshold fixed, 1244.5 and 1787.9 MiB in
    every run (to 0.1 MiB; AMD EPYC family 25 model 17). Timed rows keep their own allocator settings."""
    import os

    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
    for name in ('MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_'):
        env.pop(name, None)
    return env


def peak_in_subprocess(module: str, args: list[str], timeout: float = 1800) -> float:
    """Run ``python -m module *args`` (a measurement that prints ``{"peak_mib": ...}`` as its last line) in
    :func:`child_env` and return that figure; the child's stderr tail in the error when it fails."""
    out = subprocess.run([sys.executable, '-m', module, *args], capture_output=True, text=True, timeout=timeout,
                         env=child_env())
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])['peak_mib']


def rss_growth_mib(fn) -> float:
    """Call ``fn()`` once; the growth of this process's RSS high-water mark over the call in MiB (Linux: the mark is
    reset to the current RSS first, so what was built before does not hide the call's peak)."""
    if not _reset_peak_rss():
        raise RuntimeError('peak memory needs Linux /proc/self/clear_refs')
    base = _status_kib('VmRSS')
    fn()
    return (_status_kib('VmHWM') - base) / 1024


if __name__ == '__main__':
    _family, _arch, _name, _size, _cp, _device = sys.argv[1:7]
    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.analysis.timing import parse_hw
    print(json.dumps({'peak_mib': measure_peak_memory(_family, _arch, _name, parse_hw(_size), _cp == '1',
                                                      _device)}))
