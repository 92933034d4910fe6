"""A literal EfficientFormer (V1) dense-prediction backbone in the official formulation: the test oracle.

Written from the paper (arXiv 2206.01191) and the behaviour of the official ``fork_feat`` detection /
segmentation backbones (snap-research/EfficientFormer ``detection/backbone.py``, ``segmentation/backbone.py``
@d01da42), with their parameter names, so ``load_state_dict`` takes official dense checkpoints directly:

* stem: two stride-2 3x3 convs, each with BatchNorm and ReLU (``patch_embed.{0,1,3,4}``);
* ``network`` = ``[stage0, down1, stage1, down2, stage2, down3, stage3]``, a down being a stride-2 3x3 conv +
  BatchNorm (``proj``, ``norm``);
* a 4-D block (Meta4D): ``x + ls1 * (avgpool3x3(x) - x)``, then ``x + ls2 * BN(fc2(GELU(BN(fc1(x)))))``
  (1x1 convs);
* the last ``vit_num`` blocks of stage 3 run on tokens ``(B, N, C)`` after a flattening step (an empty slot in
  ``network.6``): pre-LayerNorm multi-head attention (8 heads, key dim 32, value dim 128) whose bias table
  ``attention_biases_seg`` (heads x resolution^2 offsets, zero at initialisation) is gathered to
  ``(heads, R^2, R^2)`` and bicubically resized to the ``(N, N)`` of the input, and a pre-LayerNorm MLP;
* output norms ``norm{0,2,4,6}`` = ``GroupNorm(1, C)``; the stage-3 tokens are reshaped back to NCHW first.

The classification bias ``attention_biases`` (heads x 49) and its index buffer are kept as unused buffers, as in
the official feat model. No optimisations: this is what the plugin's :class:`~mmplugin.EfficientFormer` is checked
against.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ['ReferenceEfficientFormer', 'EFFICIENTFORMER_SETTINGS']

#: arch -> (depths, widths, vit_num) of the official feat models
EFFICIENTFORMER_SETTINGS = {
    'l1': ([3, 2, 6, 4], [48, 96, 224, 448], 1),
    'l3': ([4, 4, 12, 6], [64, 128, 320, 512], 4),
    'l7': ([6, 6, 18, 8], [96, 192, 384, 768], 8),
}


class _Attention(nn.Module):

    def __init__(self, dim: int, resolution: int, key_dim: int = 32, num_heads: int = 8, attn_ratio: int = 4):
        super().__init__()
        self.num_heads, self.key_dim = num_heads, key_dim
        self.d = attn_ratio * key_dim
        self.scale = key_dim**-0.5
        self.qkv = nn.Linear(dim, num_heads * (2 * key_dim + self.d))
        self.proj = nn.Linear(num_heads * self.d, dim)
        offsets: dict[tuple[int, int], int] = {}
        idxs = []
        points = list(itertools.product(range(resolution), range(resolution)))
        for a in points:
            for b in points:
                off = (abs(a[0] - b[0]), abs(a[1] - b[1]))
                idxs.append(offsets.setdefault(off, len(offsets)))
        self.register_buffer('attention_biases', torch.zeros(num_heads, 49))
        self.register_buffer('attention_bias_idxs', torch.ones(49, 49, dtype=torch.long))
        self.attention_biases_seg = nn.Parameter(torch.zeros(num_heads, len(offsets)))
        self.register_buffer('attention_bias_idxs_seg', torch.tensor(idxs).view(len(points), len(points)))

    def forward(self, x):  # (B, N, C)
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, self.num_heads, -1).split([self.key_dim, self.key_dim, self.d], dim=3)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        bias = self.attention_biases_seg[:, self.attention_bias_idxs_seg]
        attn = attn + F.interpolate(bias.unsqueeze(0), size=(n, n), mode='bicubic')
        attn = attn.softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, -1))


class _ConvMlp(nn.Module):

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)
        self.norm1 = nn.BatchNorm2d(hidden)
        self.norm2 = nn.BatchNorm2d(dim)

    def forward(self, x):
        return self.norm2(self.fc2(self.act(self.norm1(self.fc1(x)))))


class _LinearMlp(nn.Module):

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _Meta4D(nn.Module):

    def __init__(self, dim: int, layer_scale: float):
        super().__init__()
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.mlp = _ConvMlp(dim, 4 * dim)
        self.layer_scale_1 = nn.Parameter(layer_scale * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x):
        x = x + self.layer_scale_1[:, None, None] * (self.pool(x) - x)
        return x + self.layer_scale_2[:, None, None] * self.mlp(x)


class _Meta3D(nn.Module):

    def __init__(self, dim: int, layer_scale: float, resolution: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mixer = _Attention(dim, resolution)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _LinearMlp(dim, 4 * dim)
        self.layer_scale_1 = nn.Parameter(layer_scale * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x):
        x = x + self.layer_scale_1[None, None] * self.token_mixer(self.norm1(x))
        return x + self.layer_scale_2[None, None] * self.mlp(self.norm2(x))


class _Flat(nn.Module):

    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


class _Down(nn.Module):

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, 3, 2, 1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.norm(self.proj(x))


class ReferenceEfficientFormer(nn.Module):
    """Official-formulation EfficientFormer ``*_feat`` backbone (random init; load official weights into it).

    Args:
        depths / widths / vit_num: see :data:`EFFICIENTFORMER_SETTINGS`.
        resolution: side of the attention-bias grid (25 in the official detection code, 16 in segmentation).
        layer_scale: initial layer-scale value (1e-5; 1e-6 for l7).

    ``forward((B, 3, H, W))`` returns four GroupNorm-ed NCHW maps at strides 4, 8, 16, 32.
    """

    def __init__(self, depths, widths, vit_num: int, resolution: int = 25, layer_scale: float = 1e-5):
        super().__init__()
        self.patch_embed = nn.Sequential(
            nn.Conv2d(3, widths[0] // 2, 3, 2, 1), nn.BatchNorm2d(widths[0] // 2), nn.ReLU(),
            nn.Conv2d(widths[0] // 2, widths[0], 3, 2, 1), nn.BatchNorm2d(widths[0]), nn.ReLU())
        network = []
        for i, (depth, dim) in enumerate(zip(depths, widths)):
            blocks: list[nn.Module] = []
            if i == 3 and vit_num == depth:
                blocks.append(_Flat())
            for j in range(depth):
                if i == 3 and depth - j <= vit_num:
                    blocks.append(_Meta3D(dim, layer_scale, resolution))
                else:
                    blocks.append(_Meta4D(dim, layer_scale))
                    if i == 3 and depth - j - 1 == vit_num:
                        blocks.append(_Flat())
            network.append(nn.Sequential(*blocks))
            if i < 3:
                network.append(_Down(dim, widths[i + 1]))
        self.network = nn.ModuleList(network)
        for k, idx in enumerate((0, 2, 4, 6)):
            self.add_module(f'norm{idx}', nn.GroupNorm(1, widths[k]))

    def forward(self, x):
        x = self.patch_embed(x)
        outs = []
        for idx, block in enumerate(self.network):
            if x.dim() == 4:
                b, c, h, w = x.shape
            x = block(x)
            if idx in (0, 2, 4, 6):
                if x.dim() != 4:
                    x = x.transpose(1, 2).reshape(b, c, h, w)
                outs.append(getattr(self, f'norm{idx}')(x))
        return outs
