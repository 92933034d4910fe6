"""Stochastic depth."""
from __future__ import annotations

import torch
from torch import nn


class DropPath(nn.Module):
    """Drop whole residual branches per sample with probability ``p`` (stochastic depth), rescaling survivors.

    Args:
        p (float): drop probability. ``0`` makes the module the identity.
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f'p={self.p}'


def linear_drop_path_rates(rate: float, total: int) -> list[float]:
    """Rates rising linearly from 0 to ``rate`` over ``total`` blocks (the Swin schedule)."""
    if total <= 1:
        return [0.0] * total
    return [rate * i / (total - 1) for i in range(total)]
