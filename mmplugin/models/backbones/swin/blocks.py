"""The building blocks of Swin V1 and V2 on ``(B, H, W, C)`` maps: MLP, (shifted-)window block, patch merging and
stage. Parameter names are the official ones (``blocks.{j}.attn.qkv``, ``downsample.reduction`` ...)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mmplugin.models.backbones.swin.attention import WindowAttention, WindowAttentionV2
from mmplugin.models.backbones.swin.windows import WindowGeometry, must_pad, padded_size
from mmplugin.models.layers.drop import DropPath
from mmplugin.models.layers.fusion import linear, linear_act, linear_add
from mmplugin.models.layers.gemm import train_linear
from mmplugin.models.layers.low_precision_norm import add_layer_norm, layer_norm
from mmplugin.models.layers.recompute import gelu_linear, layer_norm_linear, recompute_applies

__all__ = ['Mlp', 'SwinBlock', 'PatchMerging', 'SwinStage']


class Mlp(nn.Module):
    """``drop(fc2(drop(GELU(fc1(x)))))`` on the last dim (dropout as in the official code and mmdet's FFN).

    At inference on a CPU (fp32, no autograd) GELU runs inside the fc1 GEMM and, through :meth:`forward_residual`,
    the block's residual add inside the fc2 GEMM (oneDNN post-ops, :mod:`mmplugin.models.layers.fusion`): two
    passes over the 4C-wide hidden map and one over the C-wide output fewer per block. In CPU training the backward
    recomputes ``GELU(h)`` instead of keeping it beside ``h`` (:mod:`mmplugin.models.layers.recompute`): 4C values
    per token and block less held through the step.
    """

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """``mlp(x)``, or ``mlp(norm(x))`` with the ``nn.LayerNorm`` ``norm`` (V1's pre-norm: in CPU training the
        backward then recomputes ``norm(x)`` instead of keeping it)."""
        if self.drop.p == 0 and recompute_applies(x, self.fc1.weight, self.fc2.weight):
            # training: keeps fc1's output, not also GELU's (nor the normalised input)
            h = (layer_norm_linear(x, norm, self.fc1.weight, self.fc1.bias) if norm is not None
                 else train_linear(x, self.fc1.weight, self.fc1.bias))
            return gelu_linear(h, self.fc2.weight, self.fc2.bias)
        if norm is not None:
            x = layer_norm(norm, x)
        return self.drop(linear(self.drop(linear_act(x, self.fc1, 'gelu')), self.fc2))

    def forward_residual(self, x: torch.Tensor, norm: nn.Module, drop_path: nn.Module) -> torch.Tensor:
        """``x + drop_path(mlp(norm(x)))`` (V1's second half): the add fused into fc2 when nothing random runs
        between them."""
        if self.training and (self.drop.p > 0 or drop_path.p > 0):
            return x + drop_path(self.forward(x, norm))
        if self.drop.p == 0 and recompute_applies(x, self.fc1.weight, self.fc2.weight):
            return x + self.forward(x, norm)
        return linear_add(linear_act(layer_norm(norm, x), self.fc1, 'gelu'), self.fc2, x)


class SwinBlock(nn.Module):
    """One (shifted-)window transformer block on ``(B, H, W, C)`` maps; whether its windows are shifted is the
    :class:`WindowGeometry` its stage hands it.

    V1 (pre-norm): ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``.
    V2 (res-post-norm): ``x + norm1(attn(x))``, ``x + norm2(mlp(x))``.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, *, mlp_ratio: float, qkv_bias: bool,
                 drop_path: float, v2: bool, pretrained_window_size: int = 0, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0):
        super().__init__()
        self.v2 = v2
        self.norm1 = nn.LayerNorm(dim)
        if v2:
            self.attn = WindowAttentionV2(dim, num_heads, window_size, qkv_bias=qkv_bias,
                                          pretrained_window_size=pretrained_window_size, attn_drop=attn_drop,
                                          proj_drop=drop)
        else:
            self.attn = WindowAttention(dim, num_heads, window_size, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                        attn_drop=attn_drop, proj_drop=drop)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, geom: WindowGeometry) -> torch.Tensor:
        if self.v2:
            if not (self.drop_path.training and self.drop_path.p > 0):  # the add may run in the LayerNorm's pass
                x = add_layer_norm(x, self.norm1, self.attn(x, geom))
                return add_layer_norm(x, self.norm2, self.mlp(x))
            x = x + self.drop_path(layer_norm(self.norm1, self.attn(x, geom)))
            return x + self.drop_path(layer_norm(self.norm2, self.mlp(x)))
        if self.training and self.drop_path.p > 0:
            x = x + self.drop_path(self.attn(layer_norm(self.norm1, x), geom))
        else:  # the residual add may run inside the attention's output projection
            x = self.attn(layer_norm(self.norm1, x), geom, residual=x)
        return self.mlp.forward_residual(x, self.norm2, self.drop_path)


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat in the official channel order ``[(0,0), (1,0), (0,1), (1,1)]`` (row, col), then
    ``norm(4C) -> reduction`` (V1) or ``reduction -> norm(2C)`` (V2). Odd maps are padded bottom/right."""

    def __init__(self, dim: int, post_norm: bool, norm: bool = True):
        super().__init__()
        self.post_norm = post_norm
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(2 * dim if post_norm else 4 * dim) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        if must_pad(h, w, 2):
            hp, wp = padded_size(h, 2), padded_size(w, 2)
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
            h, w = hp, wp
        # (B, H/2, row, W/2, col, C) -> (B, H/2, W/2, col, row, C): channel block index = 2*col + row
        x = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h // 2, w // 2, 4 * c)
        if self.post_norm:
            return layer_norm(self.norm, linear(x, self.reduction))
        return linear(layer_norm(self.norm, x), self.reduction)


class SwinStage(nn.Module):
    """``depth`` blocks alternating regular and shifted windows (odd blocks shifted), then an optional PatchMerging.

    The window geometry (padding, gather indices, shift mask) is computed once per stage and forward.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: int, *, mlp_ratio: float, qkv_bias: bool,
                 dprs: Sequence[float], downsample: bool, v2: bool, pretrained_window_size: int,
                 pad_small_map: bool = True, merge_norm: bool = True, **block_kwargs):
        super().__init__()
        self.window_size, self.pad_small_map = window_size, pad_small_map
        self.blocks = nn.ModuleList([
            SwinBlock(dim, num_heads, window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop_path=dprs[j], v2=v2,
                      pretrained_window_size=pretrained_window_size, **block_kwargs) for j in range(depth)
        ])
        self.downsample = PatchMerging(dim, post_norm=v2, norm=merge_norm) if downsample else None

    def forward(self, x: torch.Tensor, run_block=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: ``(B, H, W, C)``. Returns the stage output and the merged map for the next stage (or None).

        ``run_block(block, x, geometry)`` calls a block (the backbone's, which adds gradient checkpointing).
        """
        _, h, w, _ = x.shape
        ws, shift = self.window_size, self.window_size // 2
        if not self.pad_small_map and min(h, w) <= ws:
            # official classification code / timm / mmpretrain: the window shrinks to the map, no shift
            ws, shift = min(h, w), 0
        geoms = [WindowGeometry(h, w, ws, 0, x.device, x.dtype)]
        if len(self.blocks) > 1:
            geoms.append(WindowGeometry(h, w, ws, shift, x.device, x.dtype) if shift else geoms[0])
        for j, blk in enumerate(self.blocks):
            x = run_block(blk, x, geoms[j % 2]) if run_block is not None else blk(x, geoms[j % 2])
        return x, (self.downsample(x) if self.downsample is not None else None)
