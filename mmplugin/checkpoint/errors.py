"""The errors of checkpoint handling: one base class, so callers (the tools) catch every loading failure at once."""
from __future__ import annotations

from mmplugin.utils.errors import UserError

__all__ = ['CheckpointError', 'CheckpointNotFoundError', 'UnsafeCheckpointError']


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file is missing, unreadable or does not fit the model."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file or URL does not exist (also a :class:`FileNotFoundError`, for existing callers)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint carries pickled objects outside the allow-list; it was refused and nothing in it ran."""
