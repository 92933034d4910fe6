"""Argument checks shared by the backbone families, and the error raised for arguments a backbone cannot honour."""
from __future__ import annotations

from mmplugin.utils.errors import ConfigTypeError, ConfigValueError, UserError

__all__ = ['UnsupportedArgumentsError', 'check_int_list']


class UnsupportedArgumentsError(UserError, ValueError, TypeError):
    """Arguments a plugin backbone cannot honour (a ValueError and a TypeError, so either ``except`` catches it)."""


def check_int_list(value, name: str, n: int, minimum: int = 1, owner: str = 'mmplugin') -> list[int]:
    """``value`` as a list of ``n`` ints >= ``minimum`` (an int is repeated); ValueError / TypeError naming ``name``."""
    vals = [value] * n if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(vals, (list, tuple)) or len(vals) != n:
        raise ConfigValueError(f'{owner}: {name} must be an int or a list of {n} ints (one per stage), got {value!r}')
    if any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        raise ConfigTypeError(f'{owner}: {name} must hold ints, got {value!r}')
    if any(v < minimum for v in vals):
        raise ConfigValueError(f'{owner}: {name} must be >= {minimum}, got {value!r}')
    return list(vals)
