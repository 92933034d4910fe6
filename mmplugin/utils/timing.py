"""Side-by-side timing shared by tools/benchmark.py and tools/speed_table.py."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each zero-argument function.

    One warm-up call each, then ``rounds`` rounds that call every function once in turn, so that a slow spell of the
    machine hits all of them alike (ratios stay meaningful on a noisy 2-core CPU where absolute times drift).
    A function that runs asynchronous work (CUDA) must synchronise before it returns.
    """
    if rounds < 1:
        raise ValueError(f'rounds must be >= 1, got {rounds}')
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}
