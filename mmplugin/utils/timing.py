"""Side-by-side timing shared by tools/benchmark.py and tools/speed_table.py."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, settle: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each zero-argument function.

    One warm-up call each, then ``rounds`` rounds that call every function once in turn, so that a slow spell of the
    machine hits all of them alike (ratios stay meaningful on a noisy 2-core CPU where absolute times drift).
    A function that runs asynchronous work (CUDA) must synchronise before it returns. ``settle`` seconds of sleep
    (untimed) before each call let the previous function's worker threads stop spinning: runtimes with their own
    thread pools (onnxruntime, XNNPACK, OpenMP) keep them busy-waiting for a while after a call, which on a 2-core
    machine takes the cores from whatever runs next.
    """
    if rounds < 1:
        raise ValueError(f'rounds must be >= 1, got {rounds}')
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            if settle:
                time.sleep(settle)
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


PEAK_SIZE = 4096


def matmul_peak_call(dtype=None, kernel: str = 'mkl') -> tuple[Callable[[], object], float]:
    """``(fn, gflop)``: a zero-argument ``PEAK_SIZE`` x ``PEAK_SIZE`` product in ``dtype`` (default fp32) to time
    beside the models (e.g. in the same :func:`interleaved` rounds), and its GFLOP (2 n^3 / 1e9): the "matmul peak"
    that the tables' shares refer to is ``gflop / seconds``. ``kernel``: ``'mkl'`` (``torch.mm``: torch's BLAS) or
    ``'onednn'`` (oneDNN's linear); the tables time both and take the faster, since on AMD CPUs MKL's fp32 product
    can run at half oneDNN's."""
    import torch
    n = PEAK_SIZE
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    if kernel == 'onednn':
        bt = b.t().contiguous()
        return (lambda: torch.ops.mkldnn._linear_pointwise(a, bt, None, 'none', [], '')), 2 * n**3 / 1e9
    return (lambda: torch.mm(a, b)), 2 * n**3 / 1e9
