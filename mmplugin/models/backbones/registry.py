"""The table of backbone families that tools iterate over, and lookup of a family by name or by checkpoint.

A family registers itself by declaring ``family = '<name>'`` on its :class:`~.base.BaseBackbone` subclass.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mmplugin.checkpoint import CheckpointError

if TYPE_CHECKING:
    from mmplugin.models.backbones.base import BaseBackbone

__all__ = ['FAMILIES', 'register_family', 'get_family', 'detect_family']

#: family name -> backbone class, in registration order. Filled by :func:`register_family`.
FAMILIES: dict[str, type['BaseBackbone']] = {}


def register_family(cls: type['BaseBackbone']) -> None:
    """Record ``cls`` under the ``family`` it declares in its own body (inherited names do not count).

    Raises:
        ValueError: another class already declared that family name.
    """
    name = cls.__dict__.get('family')
    if name:
        if name in FAMILIES and FAMILIES[name].__qualname__ != cls.__qualname__:
            raise ValueError(f'backbone family {name!r} is already declared by {FAMILIES[name].__name__}')
        FAMILIES[name] = cls


def get_family(name: str) -> type['BaseBackbone']:
    """The backbone class of family ``name``; ValueError listing the known families otherwise."""
    if name not in FAMILIES:
        raise ValueError(f'unknown backbone family {name!r}; known: {sorted(FAMILIES)}')
    return FAMILIES[name]


def detect_family(state_dict: dict[str, torch.Tensor]) -> type['BaseBackbone']:
    """The one family whose :meth:`BaseBackbone.detect` accepts ``state_dict``.

    Raises:
        CheckpointError: no family or more than one family recognises the keys.
    """
    hits = [cls for cls in FAMILIES.values() if cls.detect(state_dict)]
    if len(hits) == 1:
        return hits[0]
    keys = list(state_dict)[:5]
    if not hits:
        raise CheckpointError(f'no known backbone family ({", ".join(FAMILIES)}) recognises this checkpoint '
                              f'(first keys: {keys}); pass the family explicitly')
    raise CheckpointError(f'the checkpoint matches several families ({", ".join(c.family for c in hits)}); '
                          'pass the family explicitly')
