"""Exceptions that report a user's mistake in a config, on a command line or in a file they gave.

Every such exception derives from :class:`UserError`; the tools print one as a single ``error: ...`` line with exit
code 2 (:func:`mmplugin.cli.common.tool_main`), and anything else is a bug that keeps its traceback. Each subclass
also derives from the builtin type a caller would catch (``ValueError``, ``TypeError``, ...), so ``except
ValueError`` keeps working. Kept here, below everything that raises them, so the tools' handling imports nothing
above the primitives.
"""
from __future__ import annotations

__all__ = ['UserError', 'ConfigValueError', 'ConfigTypeError', 'PartError', 'ConfigWiringError']


class UserError(Exception):
    """Base of every exception that means "the input is wrong", not "the code is wrong"."""


class ConfigValueError(UserError, ValueError):
    """An argument of a plugin module (backbone, wrapper, neck) has a value it cannot take; the message starts
    with the module's registered name (``mmplugin.SwinTransformer: ...``)."""


class ConfigTypeError(UserError, TypeError):
    """An argument of a plugin module has a type it cannot take."""


class PartError(UserError, ValueError):
    """The model has no such part (e.g. ``backbone+neck`` of a model without a neck)."""


class ConfigWiringError(UserError, ValueError):
    """The config's neck (or head) expects other channels than its backbone gives."""
