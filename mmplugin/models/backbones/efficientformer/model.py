"""EfficientFormer (V1) as a dense-prediction backbone, exact to the official ``*_feat`` detection / segmentation
models (snap-research/EfficientFormer, the recipe SwiftFormer's Table 3 compares against).

Why not ``mmpretrain.EfficientFormer``: its last stage adds the ImageNet 7x7 attention bias ``(heads, 49, 49)``
as is, so it only runs on 224x224 inputs (any other token count is a shape error), and it has no place for the
``attention_biases_seg`` table the official dense backbones learn. Here the last stage follows the official feat
model: a zero-initialised bias table over a ``resolution x resolution`` grid of offsets (25 in the official
detection code, 16 in segmentation), gathered to ``(heads, R^2, R^2)`` and bicubically resized to the actual
token count. mmpretrain's and the official ImageNet files both load
(:mod:`mmplugin.models.backbones.efficientformer.converter`).

Layout (official parameter names): stem ``patch_embed.{0,1,3,4}``; ``network.{0,2,4,6}`` the stages,
``network.{1,3,5}`` the stride-2 downsamples (conv + BatchNorm); stage 3 ends with ``vit_num`` attention blocks on
tokens, after an empty slot where the official model flattens; output norms ``norm{0..3}`` = ``GroupNorm(1, C)``.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmplugin.models.backbones.arguments import check_int_list
from mmplugin.models.backbones.base import BaseBackbone
from mmplugin.models.backbones.efficientformer.converter import convert_efficientformer, is_efficientformer
from mmplugin.models.backbones.metaformer_layout import MetaFormerLayout
from mmplugin.models.layers import DropPath
from mmplugin.models.layers.low_precision_norm import layer_norm
from mmplugin.registry import MODELS
from mmplugin.utils.errors import ConfigValueError

__all__ = ['EfficientFormer']


class _Flatten(nn.Module):
    """The official model's flattening slot before the first attention block (no parameters): NCHW -> tokens."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).transpose(1, 2)


class BiasedAttention(nn.Module):
    """Multi-head self-attention over all ``N`` tokens of the stride-32 map with a learned offset bias.

    ``qkv`` packs, per head, ``key_dim`` query, ``key_dim`` key and ``attn_ratio * key_dim`` value channels (the
    official per-head interleaving). The bias ``attention_biases_seg[:, idx]`` of shape ``(heads, R^2, R^2)`` is
    resized bicubically to ``(N, N)`` (computed in fp32; cached in inference for the last token count).
    """

    def __init__(self, dim: int, resolution: int, key_dim: int = 32, num_heads: int = 8, attn_ratio: int = 4):
        super().__init__()
        self.num_heads, self.key_dim, self.d = num_heads, key_dim, attn_ratio * key_dim
        self.scale = key_dim**-0.5
        self.resolution = resolution
        self.qkv = nn.Linear(dim, num_heads * (2 * key_dim + self.d))
        self.proj = nn.Linear(num_heads * self.d, dim)
        offsets: dict[tuple[int, int], int] = {}
        idxs = [offsets.setdefault((abs(a[0] - b[0]), abs(a[1] - b[1])), len(offsets))
                for a in itertools.product(range(resolution), repeat=2)
                for b in itertools.product(range(resolution), repeat=2)]
        self.attention_biases_seg = nn.Parameter(torch.zeros(num_heads, len(offsets)))
        self.register_buffer('bias_index', torch.tensor(idxs).view(resolution**2, resolution**2), persistent=False)
        self._cache: tuple | None = None

    def attention_bias(self, n: int) -> torch.Tensor:
        """``(1, heads, n, n)`` fp32 bias for ``n`` tokens."""
        table = self.attention_biases_seg
        key = (n, table.device, table._version, table.data_ptr()) if table.device.type != 'meta' else None
        grad = torch.is_grad_enabled() and table.requires_grad
        if not grad and key is not None and self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        bias = table.float()[:, self.bias_index].unsqueeze(0)
        bias = F.interpolate(bias, size=(n, n), mode='bicubic')
        if not grad and key is not None and not torch.compiler.is_compiling():
            self._cache = (key, bias)
        return bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, C)`` -> ``(B, N, C)``."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, self.num_heads, -1).split([self.key_dim, self.key_dim, self.d], dim=3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = (attn.float() + self.attention_bias(n)).softmax(dim=-1).to(v.dtype)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, -1))


class ConvMlp(nn.Module):
    """1x1 conv -> BatchNorm -> GELU -> 1x1 conv -> BatchNorm (official ``Mlp`` names)."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)
        self.norm1 = nn.BatchNorm2d(hidden)
        self.norm2 = nn.BatchNorm2d(dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm2(self.fc2(self.drop(self.act(self.norm1(self.fc1(x)))))))


class PoolBlock(nn.Module):
    """4-D block: ``x + ls1 * (avgpool3x3(x) - x)`` (padding excluded from the mean), ``x + ls2 * ConvMlp(x)``."""

    def __init__(self, dim: int, mlp_ratio: float, drop: float, drop_path: float, layer_scale_init: float):
        super().__init__()
        self.token_mixer = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.mlp = ConvMlp(dim, int(dim * mlp_ratio), drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.layer_scale_1 = nn.Parameter(layer_scale_init * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale_init * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.layer_scale_1[:, None, None] * (self.token_mixer(x) - x))
        return x + self.drop_path(self.layer_scale_2[:, None, None] * self.mlp(x))


class LinearMlp(nn.Module):

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class AttentionBlock(nn.Module):
    """3-D block on tokens: pre-LayerNorm :class:`BiasedAttention` and MLP, each with a layer scale."""

    def __init__(self, dim: int, mlp_ratio: float, drop: float, drop_path: float, layer_scale_init: float,
                 resolution: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mixer = BiasedAttention(dim, resolution)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = LinearMlp(dim, int(dim * mlp_ratio), drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.layer_scale_1 = nn.Parameter(layer_scale_init * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale_init * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.layer_scale_1 * self.token_mixer(layer_norm(self.norm1, x)))
        return x + self.drop_path(self.layer_scale_2 * self.mlp(layer_norm(self.norm2, x)))


class Downsample(nn.Module):
    """Stride-2 3x3 conv + BatchNorm between stages (official ``Embedding``: ``proj``, ``norm``)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, 3, 2, 1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


@MODELS.register_module()
class EfficientFormer(MetaFormerLayout, BaseBackbone):
    """EfficientFormer (V1) backbone returning a 4-level pyramid (strides 4/8/16/32), the official ``*_feat`` model.

    Paper: https://arxiv.org/abs/2206.01191. Weights: the official ImageNet files (``efficientformer_l1_300d.pth``,
    ``'model'`` container), mmpretrain's ``efficientformer-l*_3rdparty_in1k`` files and dense checkpoints of the
    official detection / segmentation code load through ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``.

    Args:
        arch (str | dict): ``'l1' | 'l3' | 'l7'`` or ``dict(depths=[4 ints], embed_dims=[4 ints], vit_num=int)``
            (``vit_num``: attention blocks at the end of stage 3, at most its depth).
        resolution (int): side of the attention-bias offset grid: 25 (official detection backbone, default) or 16
            (official segmentation backbone). The bias is resized to any input, so this only has to match the
            checkpoint's ``attention_biases_seg`` (``(8, resolution^2)``).
        in_channels (int): image channels (3).
        out_indices (Sequence[int]): stages to return. Defaults to (0, 1, 2, 3).
        mlp_ratio (float): MLP expansion (4).
        drop_rate (float): dropout inside the MLPs (0).
        drop_path_rate (float): stochastic depth, block ``k`` of all gets ``rate * k / (total - 1)`` (official).
        layer_scale_init (float | None): initial layer scale; None: 1e-6 for l7, else 1e-5 (official).
        frozen_stages / norm_eval / with_cp / init_cfg / pretrained: see :class:`BaseBackbone`.

    Example:
        >>> model = EfficientFormer('l1').eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 250, 330))]
        [(1, 48, 63, 83), (1, 96, 32, 42), (1, 224, 16, 21), (1, 448, 8, 11)]
    """

    family = 'efficientformer'
    arch_zoo = {
        'l1': dict(depths=[3, 2, 6, 4], embed_dims=[48, 96, 224, 448], vit_num=1),
        'l3': dict(depths=[4, 4, 12, 6], embed_dims=[64, 128, 320, 512], vit_num=4),
        'l7': dict(depths=[6, 6, 18, 8], embed_dims=[96, 192, 384, 768], vit_num=8),
    }
    arch_keys = ('depths', 'embed_dims', 'vit_num')
    smoke_arch = dict(depths=[1, 1, 1, 2], embed_dims=[16, 16, 32, 32], vit_num=1)
    converter = staticmethod(convert_efficientformer)

    def __init__(self, arch: str | dict = 'l1', resolution: int = 25, in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3), mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, layer_scale_init: float | None = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, init_cfg=None, pretrained: str | None = None):
        super().__init__(in_channels=in_channels, out_indices=out_indices, frozen_stages=frozen_stages,
                         norm_eval=norm_eval, with_cp=with_cp, drop_path_rate=drop_path_rate, init_cfg=init_cfg,
                         pretrained=pretrained)
        name = self.public_name()
        s = self.resolve_arch(arch)
        depths = check_int_list(s['depths'], 'arch depths', 4, 1)
        dims = check_int_list(s['embed_dims'], 'arch embed_dims', 4, 2)
        vit_num = s['vit_num']
        if isinstance(vit_num, bool) or not isinstance(vit_num, int) or not 0 <= vit_num <= depths[3]:
            raise ConfigValueError(f'{name}: arch vit_num must be an int in 0..depths[3]={depths[3]}, got {vit_num!r}')
        if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1:
            raise ConfigValueError(f'{name}: resolution must be a positive int, got {resolution!r}')
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or mlp_ratio <= 0:
            raise ConfigValueError(f'{name}: mlp_ratio must be a positive number, got {mlp_ratio!r}')
        if isinstance(drop_rate, bool) or not isinstance(drop_rate, (int, float)) or not 0 <= drop_rate < 1:
            raise ConfigValueError(f'{name}: drop_rate must be a number in [0, 1), got {drop_rate!r}')
        key = arch.lower() if isinstance(arch, str) else None
        if layer_scale_init is None:
            layer_scale_init = 1e-6 if key == 'l7' else 1e-5
        self.arch_name = key or 'custom'
        self.depths, self.embed_dims, self.vit_num, self.resolution = depths, dims, vit_num, resolution
        self._declare_stages(dims, [4, 8, 16, 32])

        c0 = dims[0]
        self.patch_embed = nn.Sequential(nn.Conv2d(in_channels, c0 // 2, 3, 2, 1), nn.BatchNorm2d(c0 // 2), nn.ReLU(),
                                         nn.Conv2d(c0 // 2, c0, 3, 2, 1), nn.BatchNorm2d(c0), nn.ReLU())
        total = sum(depths)
        network: list[nn.Module] = []
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            blocks: list[nn.Module] = []
            first_attn = depth - vit_num if i == 3 else depth
            for j in range(depth):
                if j == first_attn:
                    blocks.append(_Flatten())
                dpr = self.drop_path_rate * (sum(depths[:i]) + j) / max(total - 1, 1)
                if j >= first_attn:
                    blocks.append(AttentionBlock(dim, mlp_ratio, drop_rate, dpr, layer_scale_init, resolution))
                else:
                    blocks.append(PoolBlock(dim, mlp_ratio, drop_rate, dpr, layer_scale_init))
            network.append(nn.Sequential(*blocks))
            if i < 3:
                network.append(Downsample(dim, dims[i + 1]))
        self.network = nn.ModuleList(network)
        self._add_out_norms(lambda c: nn.GroupNorm(1, c))
        self._finish_init()

    @classmethod
    def detect(cls, state_dict) -> bool:
        return is_efficientformer(state_dict)

    def _default_init(self) -> None:
        # official: truncated-normal linears with zero biases, and the same for the MLPs' 1x1 convs
        for m in self.modules():
            if isinstance(m, nn.Linear) or (isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def optional_missing_prefixes(self, state_dict=None) -> tuple[str, ...]:
        """Output norms, and the dense attention bias, which ImageNet files lack (it starts at zero)."""
        extra = ()
        if state_dict is not None and not any(k.endswith('attention_biases_seg') for k in state_dict):
            extra = tuple(f'network.6.{j}.token_mixer.attention_biases_seg' for j in range(len(self.network[6])))
        return super().optional_missing_prefixes(state_dict) + extra

    def block_number(self, i: int, j: int) -> int:
        """Blocks after stage 3's flattening slot (no parameters) are one index further in ``network.6``."""
        return j - 1 if i == 3 and self.vit_num and j > self.depths[3] - self.vit_num else j

    def arch_description(self) -> str:
        return (f'the model is arch {self.arch_name!r} with embed_dims={self.embed_dims}, depths={self.depths}, '
                f'vit_num={self.vit_num}, resolution={self.resolution}')

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_embed(x)

    def forward_stage(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if i:
            x = self.network[2 * i - 1](x)
        b, c, h, w = x.shape
        for blk in self.network[2 * i]:
            x = blk(x) if isinstance(blk, _Flatten) else self.run_block(blk, x)
        if x.dim() == 3:  # tokens -> NCHW
            x = x.transpose(1, 2).reshape(b, c, h, w)
        return x, x
