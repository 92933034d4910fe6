"""Running a C kernel over slices of its work on ``torch.get_num_threads()`` threads.

The kernels take a ``[begin, end)`` range of independent work items (channels, windows) and ctypes releases the GIL
during the call, so a small Python thread pool runs the slices in parallel. One pool per thread count, created on
first use and recreated in a forked child (which has none of the parent's threads, and maybe a held lock).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ['run_slices']

_state = threading.Lock()
_pool: dict[int, ThreadPoolExecutor] = {}


def _after_fork_in_child() -> None:
    global _state
    _state = threading.Lock()
    _pool.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _executor(workers: int) -> ThreadPoolExecutor:
    with _state:
        if workers not in _pool:
            _pool[workers] = ThreadPoolExecutor(workers, thread_name_prefix='mmplugin-kernel')
        return _pool[workers]


def run_slices(fn: Callable[[int, int], int], total: int) -> list[int]:
    """``fn(begin, end)`` over ``[0, total)`` cut into ``min(torch.get_num_threads(), total)`` equal slices, run in
    parallel; returns each call's status code in slice order (``total == 0``: no call)."""
    workers = max(1, min(torch.get_num_threads(), total))
    edges = [total * i // workers for i in range(workers + 1)]
    if workers == 1:
        return [fn(0, total)] if total else []
    return list(_executor(workers).map(lambda i: fn(edges[i], edges[i + 1]), range(workers)))
