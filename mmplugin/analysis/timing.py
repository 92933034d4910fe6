"""Eval-forward time of several models side by side (:func:`mmplugin.utils.timing.interleaved` rounds)."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ['time_models', 'parse_hw']


def parse_hw(text: str) -> tuple[int, int]:
    """``'800x1216'`` -> ``(800, 1216)`` (height x width); ``'224'`` -> ``(224, 224)``.

    Raises:
        ValueError: not one or two positive integers separated by ``x``.
    """
    parts = text.lower().split('x')
    if len(parts) in (1, 2) and all(v.strip().isdigit() and int(v) > 0 for v in parts):
        return int(parts[0]), int(parts[-1])
    raise ValueError(f'{text!r} is not a size; write 224 (square) or 800x1333 (height x width)')


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize()


def time_models(models: dict[str, nn.Module], size: tuple[int, int], device: torch.device | str, rounds: int,
                batch: int = 1, dtype: torch.dtype | None = None) -> dict[str, float]:
    """Median seconds per eval forward of each model on a random ``(batch, 3, *size)`` input, rounds interleaved
    across the models (machine noise hits all alike); ``dtype`` times under autocast in that precision."""
    from mmplugin.utils.timing import interleaved
    device = torch.device(device)
    x = torch.randn(batch, 3, *size, device=device)
    ctx = torch.autocast(device.type, dtype=dtype) if dtype else torch.autocast(device.type, enabled=False)

    def call(m):
        def fn():
            m(x)
            _sync(device)
        return fn

    with torch.inference_mode(), ctx:
        return interleaved({name: call(m) for name, m in models.items()}, rounds)
