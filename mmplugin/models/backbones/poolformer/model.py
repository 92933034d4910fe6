"""PoolFormer (MetaFormer) as a dense-prediction backbone, exact to the official ``fork_feat`` model
(sail-sg/poolformer), one of the rows SwiftFormer's Table 3 compares against.

Why not ``mmpretrain.PoolFormer`` (same formulation, same parameter names): importing ``mmpretrain.models``
(mmpretrain 1.2.0 and onedl-mmpretrain 1.3.6) imports torchvision through its classification heads' metrics
(``mmpretrain/evaluation/metrics/visual_grounding_eval.py``), and PyPI's torchvision wheels do not load beside the
torch builds the plugin is tested with, so the row could not be built there. The plugin's family keeps the
official / mmpretrain names, so their files load here (:mod:`mmplugin.models.backbones.poolformer.converter`), and is
checked against a literal port of the official model (:mod:`mmplugin.reference.poolformer`).

Inputs whose sides are not multiples of 4 are zero-padded at the bottom / right to the next multiple before the
7x7 stride-4 stem, so every output has ``ceil(H / stride)`` rows like every plugin backbone (the official stem gives
one row fewer for ``H % 4`` in 1, 2). Detectors and segmentors feed sides divisible by 32: there the result is
the official model's.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmplugin.models.backbones.arguments import check_int_list
from mmplugin.models.backbones.base import BaseBackbone
from mmplugin.models.backbones.metaformer_layout import MetaFormerLayout
from mmplugin.models.backbones.poolformer.converter import convert_poolformer, is_poolformer
from mmplugin.models.layers import DropPath
from mmplugin.registry import MODELS
from mmplugin.utils.errors import ConfigValueError

__all__ = ['PoolFormer']


class _Mlp(nn.Module):
    """1x1 conv -> GELU -> dropout -> 1x1 conv -> dropout (official names ``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int, drop: float):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class PoolFormerBlock(nn.Module):
    """``x + ls1 * (avgpool3x3(GN(x)) - GN(x))``, then ``x + ls2 * Mlp(GN(x))``; ``GN = GroupNorm(1, C)``."""

    def __init__(self, dim: int, mlp_ratio: float, drop: float, drop_path: float, layer_scale_init: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.token_mixer = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = _Mlp(dim, int(dim * mlp_ratio), drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.layer_scale_1 = nn.Parameter(layer_scale_init * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(layer_scale_init * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.drop_path(self.layer_scale_1[:, None, None] * (self.token_mixer(y) - y))
        return x + self.drop_path(self.layer_scale_2[:, None, None] * self.mlp(self.norm2(x)))


class _Embed(nn.Module):
    """A strided conv (official ``PatchEmbed`` without norm: ``proj``)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, kernel, stride, padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@MODELS.register_module()
class PoolFormer(MetaFormerLayout, BaseBackbone):
    """PoolFormer backbone returning a 4-level pyramid (strides 4/8/16/32), the official ``fork_feat`` model.

    Paper: https://arxiv.org/abs/2111.11418. Weights: the official releases (``poolformer_s12.pth.tar``, raw),
    mmpretrain's ``poolformer-s12_3rdparty_32xb128_in1k`` files and dense checkpoints of the official detection /
    segmentation code load through ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``.

    Args:
        arch (str | dict): ``'s12' | 's24' | 's36' | 'm36' | 'm48'`` or ``dict(depths=[4 ints],
            embed_dims=[4 ints])``.
        in_channels (int): image channels (3).
        out_indices (Sequence[int]): stages to return. Defaults to (0, 1, 2, 3).
        mlp_ratio (float): MLP expansion (4).
        drop_rate (float): dropout inside the MLPs (0).
        drop_path_rate (float): stochastic depth, block ``k`` of all gets ``rate * k / (total - 1)`` (official).
        layer_scale_init (float | None): None: the official value of the arch (1e-5 for s12 / s24, else 1e-6).
        frozen_stages / norm_eval / with_cp / init_cfg / pretrained: see :class:`BaseBackbone`.

    Example:
        >>> model = PoolFormer('s12').eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 256, 320))]
        [(1, 64, 64, 80), (1, 128, 32, 40), (1, 320, 16, 20), (1, 512, 8, 10)]
    """

    family = 'poolformer'
    _s_dims, _m_dims = [64, 128, 320, 512], [96, 192, 384, 768]
    arch_zoo = {
        's12': dict(depths=[2, 2, 6, 2], embed_dims=_s_dims),
        's24': dict(depths=[4, 4, 12, 4], embed_dims=_s_dims),
        's36': dict(depths=[6, 6, 18, 6], embed_dims=_s_dims),
        'm36': dict(depths=[6, 6, 18, 6], embed_dims=_m_dims),
        'm48': dict(depths=[8, 8, 24, 8], embed_dims=_m_dims),
    }
    arch_keys = ('depths', 'embed_dims')
    smoke_arch = dict(depths=[1, 1, 2, 1], embed_dims=[16, 16, 32, 32])
    converter = staticmethod(convert_poolformer)

    def __init__(self, arch: str | dict = 's12', in_channels: int = 3, out_indices: Sequence[int] = (0, 1, 2, 3),
                 mlp_ratio: float = 4.0, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 layer_scale_init: float | None = None, frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, init_cfg=None, pretrained: str | None = None):
        super().__init__(in_channels=in_channels, out_indices=out_indices, frozen_stages=frozen_stages,
                         norm_eval=norm_eval, with_cp=with_cp, drop_path_rate=drop_path_rate, init_cfg=init_cfg,
                         pretrained=pretrained)
        name = self.public_name()
        s = self.resolve_arch(arch)
        depths = check_int_list(s['depths'], 'arch depths', 4, 1)
        dims = check_int_list(s['embed_dims'], 'arch embed_dims', 4, 1)
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or mlp_ratio <= 0:
            raise ConfigValueError(f'{name}: mlp_ratio must be a positive number, got {mlp_ratio!r}')
        if isinstance(drop_rate, bool) or not isinstance(drop_rate, (int, float)) or not 0 <= drop_rate < 1:
            raise ConfigValueError(f'{name}: drop_rate must be a number in [0, 1), got {drop_rate!r}')
        key = arch.lower() if isinstance(arch, str) else None
        if layer_scale_init is None:
            layer_scale_init = 1e-5 if key in (None, 's12', 's24') else 1e-6
        self.arch_name = key or 'custom'
        self.depths, self.embed_dims = depths, dims
        self._declare_stages(dims, [4, 8, 16, 32])
        self.patch_embed = _Embed(in_channels, dims[0], 7, 4, 2)
        total = sum(depths)
        network: list[nn.Module] = []
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            network.append(nn.Sequential(*[
                PoolFormerBlock(dim, mlp_ratio, drop_rate,
                                self.drop_path_rate * (sum(depths[:i]) + j) / max(total - 1, 1), layer_scale_init)
                for j in range(depth)]))
            if i < 3:
                network.append(_Embed(dim, dims[i + 1], 3, 2, 1))
        self.network = nn.ModuleList(network)
        self._add_out_norms(lambda c: nn.GroupNorm(1, c))
        self._finish_init()

    @classmethod
    def detect(cls, state_dict) -> bool:
        return is_poolformer(state_dict)

    def _default_init(self) -> None:
        # official: truncated-normal linears and convs are PyTorch's default; the MLP convs as linears
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def arch_description(self) -> str:
        return f'the model is arch {self.arch_name!r} with embed_dims={self.embed_dims}, depths={self.depths}'

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        ph, pw = -x.shape[2] % 4, -x.shape[3] % 4
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        return self.patch_embed(x)

    def forward_stage(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if i:
            x = self.network[2 * i - 1](x)
        for blk in self.network[2 * i]:
            x = self.run_block(blk, x)
        return x, x
