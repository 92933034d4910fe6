"""The parameter layout EfficientFormer and PoolFormer share (the official MetaFormer code): a stem
``patch_embed``, ``network = [stage0, down1, stage1, down2, stage2, down3, stage3]`` (stages at even indices,
stride-2 downsamples at odd ones) and output norms ``norm{i}``: freezing groups and layer-wise depths of that layout
in one place."""
from __future__ import annotations

import re

from torch import nn

__all__ = ['MetaFormerLayout']


class MetaFormerLayout:
    """Mixin for a :class:`~.base.BaseBackbone` with ``self.patch_embed``, ``self.network`` and ``self.depths``."""

    def stem_modules(self) -> list[nn.Module]:
        return [self.patch_embed]

    def stage_modules(self, i: int) -> list[nn.Module]:
        return [self.network[2 * i]] + ([self.network[2 * i - 1]] if i else [])

    def block_number(self, i: int, j: int) -> int:
        """Index among stage ``i``'s blocks of the module at ``network[2 * i][j]`` (a family with parameter-free
        slots between blocks shifts it)."""
        return j

    def layer_depth(self, name: str) -> int:
        """0 stem; blocks numbered 1..sum(depths) in order; a downsample shares the next stage's first block's
        index and an output norm its stage's last block's; anything else ``num_layers - 1``."""
        if name.startswith('patch_embed.'):
            return 0
        m = re.match(r'network\.(\d+)\.(?:(\d+)\.)?', name)
        if m:
            n = int(m.group(1))
            i = (n + 1) // 2
            return sum(self.depths[:i]) + 1 + (0 if n % 2 else self.block_number(i, int(m.group(2))))
        m = re.match(r'norm(\d+)\.', name)
        if m:
            return sum(self.depths[:int(m.group(1)) + 1])
        return self.num_layers - 1

    @property
    def num_layers(self) -> int:
        return sum(self.depths) + 2
