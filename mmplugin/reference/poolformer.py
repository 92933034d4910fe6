"""A literal PoolFormer dense-prediction backbone in the official formulation: the test oracle.

Written from the paper (MetaFormer, arXiv 2111.11418) and the official ``fork_feat`` detection / segmentation
backbone (sail-sg/poolformer ``models/poolformer.py``), with its parameter names, so ``load_state_dict`` takes
official files directly:

* stem: 7x7 stride-4 conv with padding 2 (``patch_embed.proj``), no norm;
* ``network`` = ``[stage0, down1, stage1, down2, stage2, down3, stage3]``, a down being a 3x3 stride-2 conv with
  padding 1 (``proj``);
* block: ``x + ls1 * (avgpool3x3(GN(x)) - GN(x))`` (padding excluded from the mean), then
  ``x + ls2 * fc2(GELU(fc1(GN(x))))`` (1x1 convs), ``GN = GroupNorm(1, C)``;
* output norms ``norm{0,2,4,6}`` = ``GroupNorm(1, C)``.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ['ReferencePoolFormer', 'POOLFORMER_SETTINGS']

#: arch -> (depths, widths, layer-scale init) of the official models
POOLFORMER_SETTINGS = {
    's12': ([2, 2, 6, 2], [64, 128, 320, 512], 1e-5),
    's24': ([4, 4, 12, 4], [64, 128, 320, 512], 1e-5),
    's36': ([6, 6, 18, 6], [64, 128, 320, 512], 1e-6),
    'm36': ([6, 6, 18, 6], [96, 192, 384, 768], 1e-6),
    'm48': ([8, 8, 24, 8], [96, 192, 384, 768], 1e-6),
}


class _Block(nn.Module):

    def __init__(self, dim: int, layer_scale: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Conv2d(dim, 4 * dim, 1)
        self.mlp.fc2 = nn.Conv2d(4 * dim, dim, 1)
        self.layer_scale_1 = nn.Parameter(layer_scale * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.layer_scale_1.unsqueeze(-1).unsqueeze(-1) * (self.pool(y) - y)
        y = self.mlp.fc2(nn.functional.gelu(self.mlp.fc1(self.norm2(x))))
        return x + self.layer_scale_2.unsqueeze(-1).unsqueeze(-1) * y


class _Embed(nn.Module):

    def __init__(self, cin: int, cout: int, k: int, s: int, p: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, k, s, p)

    def forward(self, x):
        return self.proj(x)


class ReferencePoolFormer(nn.Module):
    """Official-formulation PoolFormer ``fork_feat`` backbone; ``forward((B, 3, H, W))`` returns four GroupNorm-ed
    NCHW maps at strides 4, 8, 16, 32 (``H``, ``W`` divisible by 4 for those exact strides)."""

    def __init__(self, depths, widths, layer_scale: float = 1e-5):
        super().__init__()
        self.patch_embed = _Embed(3, widths[0], 7, 4, 2)
        network = []
        for i, (depth, dim) in enumerate(zip(depths, widths)):
            network.append(nn.Sequential(*[_Block(dim, layer_scale) for _ in range(depth)]))
            if i < 3:
                network.append(_Embed(dim, widths[i + 1], 3, 2, 1))
        self.network = nn.ModuleList(network)
        for k, idx in enumerate((0, 2, 4, 6)):
            self.add_module(f'norm{idx}', nn.GroupNorm(1, widths[k]))

    def forward(self, x):
        x = self.patch_embed(x)
        outs = []
        for idx, block in enumerate(self.network):
            x = block(x)
            if idx in (0, 2, 4, 6):
                outs.append(getattr(self, f'norm{idx}')(x))
        return outs
