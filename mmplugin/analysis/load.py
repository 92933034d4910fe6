"""Is the machine busy with other work? Timings taken while other processes run on the same cores are skewed
(another process on the cores changed speed ratios 25x at 2 threads), so the timing tools warn first."""
from __future__ import annotations

import os

__all__ = ['machine_load', 'load_warning', 'TIMING', 'TRAINING']


def machine_load() -> float | None:
    """The 1-minute load average (runnable processes, this one included); None where the OS does not report it."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


TIMING = ('times and even ratios are skewed; time on an idle machine or with fewer --threads')
TRAINING = ('training runs correspondingly slower than on an idle machine (on 2 cores shared with one other job, '
            'the demo took 42 min instead of ~14) and mmengine\'s ETA assumes the speed of the first iterations')


def load_warning(threads: int, *, load: float | None = None, cores: int | None = None,
                 slack: float = 0.5, effect: str = TIMING) -> str | None:
    """A warning when other work competes for the cores the timing uses, else None.

    Args:
        threads: threads the timing runs (``torch.get_num_threads()``).
        load: the load average (default :func:`machine_load`); it counts this process too (one runnable thread
            while the tool starts up, before timing).
        cores: logical CPUs (default ``os.cpu_count()``).
        slack: load beyond the free cores tolerated before warning (short-lived processes).
        effect: what the load does to the work at hand (:data:`TIMING`, :data:`TRAINING`).

    Returns:
        The warning text when ``load - 1`` (others' runnable work) exceeds the cores left free
        (``cores - threads``) by more than ``slack``; None otherwise or when the load is unknown.
    """
    load = machine_load() if load is None else load
    cores = cores or os.cpu_count() or 1
    if load is None:
        return None
    others = max(load - 1.0, 0.0)
    free = max(cores - threads, 0)
    if others <= free + slack:
        return None
    return (f'warning: the machine is loaded (load average {load:.1f} on {cores} CPUs, {threads} threads here): '
            f'other processes share the cores, so {effect}')
