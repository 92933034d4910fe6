"""A literal SwiftFormer in the official formulation, used as the test oracle and the speed baseline.

Written from the paper (arXiv 2303.15446, eq. 4-8) and the official parameter layout (key names and shapes of
``official_keys_swiftformer.txt``), deliberately without optimisations: NCHW tensors, a separate BatchNorm after
every conv, explicit layer-scale multiplies, and the global query repeated over all tokens. It is built with
``fork_feat`` output norms ``norm0/2/4/6`` so ``load_state_dict`` takes official files directly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _ConvBlock(nn.Module):

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.BatchNorm2d(dim)
        self.pwconv1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.pwconv2 = nn.Conv2d(hidden, dim, 1)
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1))

    def forward(self, x):
        y = self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x)))))
        return x + self.layer_scale * y


class _Attention(nn.Module):

    def __init__(self, dim: int, legacy: bool):
        super().__init__()
        self.legacy = legacy
        self.to_query = nn.Linear(dim, dim)
        self.to_key = nn.Linear(dim, dim)
        self.w_g = nn.Parameter(torch.randn(dim, 1))
        self.scale_factor = dim**-0.5
        self.Proj = nn.Linear(dim, dim)
        self.final = nn.Linear(dim, dim)

    def forward(self, x):  # (B, N, D)
        query = F.normalize(self.to_query(x), dim=-1)
        key = F.normalize(self.to_key(x), dim=-1)
        a = query @ self.w_g * self.scale_factor  # (B, N, 1)
        a = a.softmax(dim=-1) if self.legacy else F.normalize(a, dim=1)
        g = torch.sum(a * query, dim=1)  # (B, D)
        g = g.unsqueeze(1).repeat(1, key.shape[1], 1)  # repeated over the tokens, as the official einops.repeat
        return self.final(self.Proj(g * key) + query)


class _Mlp(nn.Module):

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(dim)
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.norm1(x))))


class _Encoder(nn.Module):

    def __init__(self, dim: int, legacy: bool):
        super().__init__()
        self.local_representation = _ConvBlock(dim, dim)
        self.attn = _Attention(dim, legacy)
        self.linear = _Mlp(dim, 4 * dim)
        self.layer_scale_1 = nn.Parameter(1e-5 * torch.ones(dim, 1, 1))
        self.layer_scale_2 = nn.Parameter(1e-5 * torch.ones(dim, 1, 1))

    def forward(self, x):
        x = self.local_representation(x)
        b, c, h, w = x.shape
        t = self.attn(x.permute(0, 2, 3, 1).reshape(b, h * w, c))
        x = x + self.layer_scale_1 * t.reshape(b, h, w, c).permute(0, 3, 1, 2)
        return x + self.layer_scale_2 * self.linear(x)


class _Embedding(nn.Module):

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, 3, stride=2, padding=1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.norm(self.proj(x))


class ReferenceSwiftFormer(nn.Module):
    """Official-formulation SwiftFormer with fork_feat outputs (BatchNorm ``norm0/2/4/6``)."""

    def __init__(self, depths, dims, legacy_softmax: bool = False):
        super().__init__()
        self.patch_embed = nn.Sequential(
            nn.Conv2d(3, dims[0] // 2, 3, 2, 1), nn.BatchNorm2d(dims[0] // 2), nn.ReLU(),
            nn.Conv2d(dims[0] // 2, dims[0], 3, 2, 1), nn.BatchNorm2d(dims[0]), nn.ReLU())
        net = []
        for i, (d, c) in enumerate(zip(depths, dims)):
            blocks = [_ConvBlock(c, 4 * c) for _ in range(d - 1)] + [_Encoder(c, legacy_softmax)]
            net.append(nn.Sequential(*blocks))
            if i < 3:
                net.append(_Embedding(c, dims[i + 1]))
        self.network = nn.ModuleList(net)
        for i in (0, 2, 4, 6):
            self.add_module(f'norm{i}', nn.BatchNorm2d(dims[i // 2]))

    def forward(self, x):
        x = self.patch_embed(x)
        outs = []
        for idx, block in enumerate(self.network):
            x = block(x)
            if idx % 2 == 0:
                outs.append(getattr(self, f'norm{idx}')(x))
        return tuple(outs)
