"""Is the machine busy with other work? Timings taken while other processes run on the same cores are skewed
(another process on the cores changed speed ratios 25x at 2 threads), so the timing tools warn first."""
from __future__ import annotations

import os

__all__ = ['machine_load', 'load_warning']


def machine_load() -> float | None:
    """The 1-minute load average (runnable processes, this one included); None where the OS does not report it."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def load_warning(threads: int, *, load: float | None = None, cores: int | None = None,
                 slack: float = 0.5) -> str | None:
    """A warning when other work competes for the cores the timing uses, else None.

    Args:
        threads: threads the timing runs (``torch.get_num_threads()``).
        load: the load average (default :func:`machine_load`); it counts this process too (one runnable thread
            while the tool starts up, before timing).
        cores: logical CPUs (default ``os.cpu_count()``).
        slack: load beyond the free cores tolerated before warning (short-lived processes).

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
    return (f'warning: the machine is loaded (load average {load:.1f} on {cores} CPUs while timing with {threads} '
            f'threads): other processes share the cores, so times and even ratios are skewed; time on an idle '
            'machine or with fewer --threads')
