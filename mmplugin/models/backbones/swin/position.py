"""Relative positions inside a Swin window: the index of V1's learnt bias table and V2's log-spaced coordinates for
its continuous position bias (CPB MLP)."""
from __future__ import annotations

import math

import torch

from mmplugin.models.backbones.swin.windows import index_cache, is_tracing

__all__ = ['relative_position_index', 'log_spaced_coords', 'coordinate_window']


def relative_position_index(ws: int, device: torch.device, table_ws: int | None = None) -> torch.Tensor:
    """``(ws*ws, ws*ws)`` index into a ``(2T-1)^2`` table (``T = table_ws``, default ``ws``):
    ``(dy + T - 1) * (2T - 1) + (dx + T - 1)``. A window smaller than the table's reads the table's centre, i.e.
    the same offsets.

    Cached in eager mode; built in the graph while tracing, so no tensor created under a fake / tracing mode
    is ever cached (non-strict export runs this code with fake tensors).
    """
    if is_tracing():
        return _relative_position_index(ws, device, table_ws)
    return _cached_relative_position_index(ws, device, table_ws)


def _relative_position_index(ws: int, device: torch.device, table_ws: int | None = None) -> torch.Tensor:
    t = table_ws or ws
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :] + (t - 1)
    return (rel[0] * (2 * t - 1) + rel[1]).to(device)


_cached_relative_position_index = index_cache(_relative_position_index)


def log_spaced_coords(ws: int, pretrained_ws: int) -> torch.Tensor:
    """V2 continuous position bias input: ``(2ws-1, 2ws-1, 2)`` log-spaced relative coordinates.

    Offsets are normalised by ``pretrained_ws - 1`` (so a fine-tuned larger window extrapolates the pretrained
    range), scaled to [-8, 8] and mapped by ``sign(t) * log2(1 + |t|) / log2(8)``.
    """
    r = torch.arange(-(ws - 1), ws, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(r, r, indexing='ij'), dim=-1)
    table = table / max(pretrained_ws - 1, 1) * 8
    return torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)


def coordinate_window(pretrained_window_size: int, window_size: int) -> int:
    """The window that normalises Swin V2's position coordinates: ``pretrained_window_size``, where 0 means the
    window in use (``window_size``: the configured one, or the smaller window of a small map)."""
    return pretrained_window_size or window_size
