"""Swin Transformer V1 (Liu et al., ICCV 2021) and V2 (Liu et al., CVPR 2022) dense-prediction backbones.

Both versions share one block (pre-norm for V1, res-post-norm for V2), one stage, one patch merging and the
window machinery in :mod:`mmplugin.models.layers.window_attention`. Feature maps are ``(B, H, W, C)`` inside and
NCHW at the outputs. Parameter names are the official ones (``layers.{i}.blocks.{j}.attn.qkv`` ...), so official
releases load as they are; other layouts go through :mod:`mmplugin.converters.swin`.

Any input size: the image is padded bottom/right to a multiple of the patch size, each block's (normalised for
V1) input to a multiple of the window before the cyclic shift (and cropped after), odd maps before patch merging.
Windows never shrink: maps smaller than the window are padded up and still shifted, as in the official
detection code, so a V1 model equals mmdet's ``SwinTransformer`` with the same weights.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from ...converters.swin import convert_swin
from ...registry import MODELS
from ..layers import DropPath, linear_drop_path_rates
from ..layers.window_attention import WindowAttention, WindowAttentionV2, WindowGeometry, must_pad, padded_size
from .base import BaseBackbone


class Mlp(nn.Module):
    """``fc2(GELU(fc1(x)))`` on the last dim."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwinBlock(nn.Module):
    """One (shifted-)window transformer block on ``(B, H, W, C)`` maps.

    V1 (pre-norm): ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``.
    V2 (res-post-norm): ``x + norm1(attn(x))``, ``x + norm2(mlp(x))``.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, shift: bool, mlp_ratio: float, qkv_bias: bool,
                 drop_path: float, v2: bool, pretrained_window_size: int = 0):
        super().__init__()
        self.v2 = v2
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.norm1 = nn.LayerNorm(dim)
        if v2:
            self.attn = WindowAttentionV2(dim, num_heads, window_size, qkv_bias, pretrained_window_size)
        else:
            self.attn = WindowAttention(dim, num_heads, window_size, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, geom: WindowGeometry) -> torch.Tensor:
        if self.v2:
            x = x + self.drop_path(self.norm1(self.attn(x, geom)))
            return x + self.drop_path(self.norm2(self.mlp(x)))
        x = x + self.drop_path(self.attn(self.norm1(x), geom))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat in the official channel order ``[(0,0), (1,0), (0,1), (1,1)]`` (row, col), then
    ``norm(4C) -> reduction`` (V1) or ``reduction -> norm(2C)`` (V2). Odd maps are padded bottom/right."""

    def __init__(self, dim: int, post_norm: bool):
        super().__init__()
        self.post_norm = post_norm
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(2 * dim if post_norm else 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        if must_pad(h, w, 2):
            hp, wp = padded_size(h, 2), padded_size(w, 2)
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
            h, w = hp, wp
        # (B, H/2, row, W/2, col, C) -> (B, H/2, W/2, col, row, C): channel block index = 2*col + row
        x = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h // 2, w // 2, 4 * c)
        if self.post_norm:
            return self.norm(self.reduction(x))
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """``depth`` blocks alternating regular and shifted windows, then an optional PatchMerging.

    The window geometry (padding, gather indices, shift mask) is computed once per stage and forward.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: int, mlp_ratio: float, qkv_bias: bool,
                 dprs: Sequence[float], downsample: bool, v2: bool, pretrained_window_size: int, with_cp: bool):
        super().__init__()
        self.window_size, self.with_cp = window_size, with_cp
        self.blocks = nn.ModuleList([
            SwinBlock(dim, num_heads, window_size, j % 2 == 1, mlp_ratio, qkv_bias, dprs[j], v2,
                      pretrained_window_size) for j in range(depth)
        ])
        self.downsample = PatchMerging(dim, post_norm=v2) if downsample else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: ``(B, H, W, C)``. Returns the stage output and the merged map for the next stage (or None)."""
        _, h, w, _ = x.shape
        ws = self.window_size
        geoms = [WindowGeometry(h, w, ws, 0, x.device)]
        if len(self.blocks) > 1:
            geoms.append(WindowGeometry(h, w, ws, ws // 2, x.device))
        for j, blk in enumerate(self.blocks):
            geom = geoms[j % 2]
            if self.with_cp and self.training and x.requires_grad:
                x = cp.checkpoint(blk, x, geom, use_reentrant=False)
            else:
                x = blk(x, geom)
        return x, (self.downsample(x) if self.downsample is not None else None)


def _per_stage(value, name: str, n: int = 4) -> list[int]:
    vals = [value] * n if isinstance(value, int) else list(value)
    if len(vals) != n:
        raise ValueError(f'{name} must be an int or a list of {n}, got {value!r}')
    return [int(v) for v in vals]


class _SwinBase(BaseBackbone):
    """Shared implementation; see :class:`SwinTransformer` and :class:`SwinTransformerV2` for the arguments."""

    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32])),
        **dict.fromkeys(['l', 'large'], dict(embed_dims=192, depths=[2, 2, 18, 2], num_heads=[6, 12, 24, 48])),
    }  # yapf: disable
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    converter = staticmethod(convert_swin)
    v2 = False

    def __init__(self, arch='tiny', in_channels: int = 3, patch_size: int = 4, window_size=7,
                 pretrained_window_size=0, mlp_ratio: float = 4.0, qkv_bias: bool = True, patch_norm: bool = True,
                 drop_path_rate: float = 0.1, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        s = self.resolve_arch(arch)
        dim, depths, heads = int(s['embed_dims']), list(s['depths']), list(s['num_heads'])
        if isinstance(s['embed_dims'], (list, tuple)):
            raise ValueError('arch embed_dims is the stage-1 width (an int); later stages double it')
        if any(int(d) < 1 for d in depths) or any(int(h) < 1 for h in heads):
            raise ValueError(f'arch depths and num_heads must be >= 1, got {depths} / {heads}')
        for i, h in enumerate(heads):
            if (dim * 2**i) % h:
                raise ValueError(f'stage {i} width {dim * 2**i} is not divisible by num_heads {h}')
        windows = _per_stage(window_size, 'window_size')
        if any(w < 1 for w in windows):
            raise ValueError(f'window_size must be >= 1, got {window_size!r}')
        pre_windows = _per_stage(pretrained_window_size, 'pretrained_window_size')
        pre_windows = [p or w for p, w in zip(pre_windows, windows)]
        if not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(f'frozen_stages must be in -1..{self.num_stages}, got {frozen_stages}')
        if patch_size < 1:
            raise ValueError(f'patch_size must be >= 1, got {patch_size}')
        self.arch_name = arch if isinstance(arch, str) else 'custom'
        self.embed_dims, self.depths, self.num_heads = dim, depths, heads
        self.window_sizes, self.pretrained_window_sizes = windows, pre_windows
        self.in_channels, self.patch_size = in_channels, patch_size
        self.out_indices = self.check_out_indices(out_indices)
        self.out_channels = [dim * 2**i for i in self.out_indices]
        self.out_strides = [patch_size * 2**i for i in self.out_indices]
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, norm_eval, with_cp

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.patch_embed.norm = nn.LayerNorm(dim) if patch_norm else nn.Identity()
        dprs = linear_drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.num_stages):
            start = sum(depths[:i])
            self.layers.append(
                SwinStage(dim * 2**i, depths[i], heads[i], windows[i], mlp_ratio, qkv_bias,
                          dprs[start:start + depths[i]], i < self.num_stages - 1, self.v2, pre_windows[i], with_cp))
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(dim * 2**i))
        self._default_init()
        self._freeze_stages()

    def _default_init(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.v2:  # res-post-norms start at zero, so every block starts as the identity (official V2 init)
            for stage in self.layers:
                for blk in stage.blocks:
                    for norm in (blk.norm1, blk.norm2):
                        nn.init.zeros_(norm.weight)
                        nn.init.zeros_(norm.bias)

    def _frozen_modules(self) -> list[nn.Module]:
        mods: list[nn.Module] = []
        if self.frozen_stages >= 0:
            mods.append(self.patch_embed)
        for i in range(min(self.frozen_stages, self.num_stages)):
            mods.append(self.layers[i])
            if i in self.out_indices:
                mods.append(getattr(self, f'norm{i}'))
        return mods

    def converter_kwargs(self) -> dict:
        return dict(version=2 if self.v2 else 1, window_sizes=self.window_sizes, out_indices=self.out_indices,
                    depths=self.depths)

    def arch_description(self) -> str:
        return (f'the model is {"V2" if self.v2 else "V1"} arch {self.arch_name!r} with embed_dims='
                f'{self.embed_dims}, depths={self.depths}, window_size={self.window_sizes}')

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Args: x: ``(B, in_channels, H, W)``. Returns NCHW maps at strides ``patch_size * 2^i``, i in out_indices."""
        self.check_input(x, self.in_channels)
        p = self.patch_size
        h, w = x.shape[-2:]
        if must_pad(h, w, p):
            x = F.pad(x, (0, padded_size(w, p) - w, 0, padded_size(h, p) - h))
        x = self.patch_embed.proj(x.contiguous(memory_format=torch.channels_last)).permute(0, 2, 3, 1)
        x = self.patch_embed.norm(x)  # (B, H/p, W/p, C)
        outs = []
        for i, stage in enumerate(self.layers):
            out, down = stage(x)
            if i in self.out_indices:
                # contiguous NCHW: mmcv's CPU/CUDA ops (RoIAlign, ...) read raw NCHW memory
                outs.append(getattr(self, f'norm{i}')(out).permute(0, 3, 1, 2).contiguous())
            if down is None:
                break
            x = down
        return tuple(outs)


@MODELS.register_module()
class SwinTransformer(_SwinBase):
    """Swin Transformer V1 backbone (https://arxiv.org/abs/2103.14030), registered as ``mmplugin.SwinTransformer``.

    Args:
        arch (str | dict): ``'tiny' | 'small' | 'base' | 'large'`` (or ``'t' | 's' | 'b' | 'l'``) or
            ``dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])``.
        in_channels (int): input channels. Defaults to 3.
        patch_size (int): patch embedding stride. Defaults to 4.
        window_size (int | list[int]): window per stage. Defaults to 7.
        mlp_ratio (float): MLP expansion. Defaults to 4.
        qkv_bias (bool): bias in qkv. Defaults to True.
        patch_norm (bool): LayerNorm after patch embedding. Defaults to True.
        drop_path_rate (float): stochastic depth, linear 0 -> rate over all blocks. Defaults to 0.1.
        out_indices (Sequence[int]): stages to return. Defaults to (0, 1, 2, 3).
        frozen_stages (int): -1 none; 0 patch embedding; i patch embedding and stages 1..i (with the patch merging
            that ends them and their output norms). Applied at construction (DDP-safe) and kept through ``train()``.
        norm_eval (bool): BatchNorm layers in eval mode while training (Swin has none; kept for API parity).
        with_cp (bool): gradient checkpointing per block. Defaults to False.
        init_cfg (dict | None): e.g. ``dict(type='Pretrained', checkpoint=PATH)``: official V1 releases, mmdet /
            mmseg / mmpretrain / timm layouts, auto-detected; the bias table is resized for another window.

    Example:
        >>> import torch
        >>> model = SwinTransformer('tiny', drop_path_rate=0.).eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 250, 330))]
        [(1, 96, 63, 83), (1, 192, 32, 42), (1, 384, 16, 21), (1, 768, 8, 11)]
    """

    v2 = False

    def __init__(self, arch='tiny', window_size=7, **kwargs):
        if 'pretrained_window_size' in kwargs:
            raise TypeError('pretrained_window_size is a Swin V2 option; use mmplugin.SwinTransformerV2')
        super().__init__(arch=arch, window_size=window_size, **kwargs)


@MODELS.register_module()
class SwinTransformerV2(_SwinBase):
    """Swin Transformer V2 backbone (https://arxiv.org/abs/2111.09883), registered as ``mmplugin.SwinTransformerV2``.

    Same arguments as :class:`SwinTransformer` plus ``pretrained_window_size`` (int for all stages or a list of 4;
    0 means "same as window_size"): the window the weights were pretrained with, which normalises the continuous
    position bias coordinates (e.g. ``[12, 12, 12, 6]`` for the official 12to16 / 12to24 fine-tunes).
    Res-post-norm, scaled cosine attention (logit scale clamped at log 100), log-spaced CPB MLP 2->512->heads,
    separate q/v biases, reduction-then-norm patch merging.
    """

    v2 = True

    def __init__(self, arch='tiny', window_size=8, pretrained_window_size=0, **kwargs):
        super().__init__(arch=arch, window_size=window_size, pretrained_window_size=pretrained_window_size, **kwargs)
