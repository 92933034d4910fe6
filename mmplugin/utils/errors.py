"""Exceptions that report a user's mistake in a config or on a command line (the tools print them as one
``error: ...`` line). Kept here, below everything that raises them, so the tools' error handling imports nothing
above the primitives."""
from __future__ import annotations

__all__ = ['PartError', 'ConfigWiringError']


class PartError(ValueError):
    """The model has no such part (e.g. ``backbone+neck`` of a model without a neck)."""


class ConfigWiringError(ValueError):
    """The config's neck (or head) expects other channels than its backbone gives."""
