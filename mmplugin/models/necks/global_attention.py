"""HTC++'s "extra global self-attention layer appended at the output of the last stage" (Swin paper, A2.2).

The paper gives that one sentence and no code (the HTC++ configs were never released). What is built here, and why:

* **A standard pre-norm transformer block** (multi-head self-attention + MLP with ratio 4, GELU, two LayerNorms,
  qkv bias), the block Swin itself is made of, with global instead of windowed attention. Its ``12 C^2``
  parameters are what the paper's counts require: Table 2(c) lists Swin-B / Swin-L HTC++ at 160M / 284M, and an
  HTC with the semantic branch and 4conv1fc heads on Swin-B / Swin-L lacks 12.6M / 28.3M of that, which is one
  such block at C = 1024 / 1536 (see ``configs/_base_/swin_htcpp.py``). An attention-only layer (``4 C^2``) would
  leave 8M / 19M unexplained.
* **Heads and width of the last stage** (Swin-B 32, Swin-L 48 heads: head dim 32 like every Swin block).
* **No position encoding**: the paper mentions none, the counts leave no room for a learned table that would cover
  the 400-1400 px multi-scale inputs, and the stage-4 features already carry position through the windowed,
  relatively biased layers below them (and the zero padding).
* **Output**: the block's residual stream goes through one more LayerNorm (every pyramid level leaves the backbone
  normalised, so the replaced level stays comparable to the others) and replaces the last level; the other levels
  pass through untouched. It is a neck, placed before the FPN (``neck=[GlobalAttentionNeck, FPN]``), so any
  backbone with a pyramid output can use it and the backbone (and its checkpoints) stay unchanged.
* **Stochastic depth** continues the backbone's linear schedule: its last rate (``drop_path_rate``) applies here.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import nn

from mmplugin.models.layers import DropPath, transformer_init_
from mmplugin.models.layers.low_precision_norm import layer_norm
from mmplugin.registry import MODELS


class GlobalSelfAttention(nn.Module):
    """Multi-head self-attention over all ``N`` tokens: ``proj(softmax(q k^T / sqrt(d)) v)``.

    Args:
        dim (int): token width ``C``.
        num_heads (int): heads; ``C`` must be divisible by it.
        qkv_bias (bool): bias on the fused ``qkv`` projection.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, C)`` -> ``(B, N, C)``."""
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)  # (B, heads, N, d)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class GlobalAttentionBlock(nn.Module):
    """Pre-norm transformer block on ``(B, N, C)`` tokens: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4., qkv_bias: bool = True, drop_path: float = 0.):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = GlobalSelfAttention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(OrderedDict(fc1=nn.Linear(dim, hidden), act=nn.GELU(), fc2=nn.Linear(hidden, dim)))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(layer_norm(self.norm1, x)))
        return x + self.drop_path(self.mlp(layer_norm(self.norm2, x)))


@MODELS.register_module()
class GlobalAttentionNeck(BaseModule):
    """Apply one global self-attention block to the last pyramid level and pass the others through.

    Put it in front of the FPN: ``neck=[dict(type='mmplugin.GlobalAttentionNeck', in_channels=[...], num_heads=48),
    dict(type='FPN', in_channels=[...], ...)]`` (mmdet builds a list of necks as a sequence). The module docstring
    says what was chosen for the unspecified parts of the paper's layer, and why.

    Args:
        in_channels (Sequence[int]): channels of every input level (the backbone's ``out_channels``); only the last
            is transformed, the list is checked against the inputs.
        num_heads (int): attention heads; ``in_channels[-1]`` must be divisible by it. Use the last stage's
            heads (Swin-T/S 24, B 32, L 48).
        mlp_ratio (float): MLP hidden width / ``C``. Defaults to 4.
        qkv_bias (bool): bias on the qkv projection. Defaults to True (as in Swin).
        drop_path (float): stochastic depth of the block's two branches. Defaults to 0.
        final_norm (bool): LayerNorm the block's output (see the module docstring). Defaults to True.
        init_cfg (dict | list[dict], optional): mmengine init config; by default linears are truncated-normal
            (std 0.02) with zero bias and LayerNorms are ones / zeros, as in the Swin backbones.

    Shapes:
        input: tuple of ``(B, C_i, H_i, W_i)``; output: the same tuple with the last level replaced by a tensor of
        the same shape.
    """

    def __init__(self, in_channels: Sequence[int], num_heads: int, mlp_ratio: float = 4., qkv_bias: bool = True,
                 drop_path: float = 0., final_norm: bool = True, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if isinstance(in_channels, int) or not in_channels or not all(int(c) > 0 for c in in_channels):
            raise ValueError(f'in_channels must be a non-empty list of positive channel counts (the backbone\'s '
                             f'out_channels), got {in_channels!r}')
        dim = int(in_channels[-1])
        if int(num_heads) < 1 or dim % int(num_heads):
            raise ValueError(f'num_heads={num_heads!r} must be >= 1 and divide the last level\'s {dim} channels '
                             f'(Swin: use the last stage\'s heads, e.g. 32 for Swin-B, 48 for Swin-L)')
        if mlp_ratio <= 0:
            raise ValueError(f'mlp_ratio must be > 0, got {mlp_ratio!r}')
        if not 0. <= drop_path < 1.:
            raise ValueError(f'drop_path must be in [0, 1), got {drop_path!r}')
        self.in_channels = [int(c) for c in in_channels]
        self.block = GlobalAttentionBlock(dim, int(num_heads), mlp_ratio, qkv_bias, drop_path)
        self.norm = nn.LayerNorm(dim) if final_norm else nn.Identity()
        self._default_init()

    def _default_init(self) -> None:
        transformer_init_(self)

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.in_channels):
            raise ValueError(f'GlobalAttentionNeck got {len(inputs)} levels but in_channels lists '
                             f'{len(self.in_channels)}: set in_channels to the backbone\'s out_channels')
        x = inputs[-1]
        if x.ndim != 4 or x.shape[1] != self.in_channels[-1]:
            raise ValueError(f'GlobalAttentionNeck expects the last level as (B, {self.in_channels[-1]}, H, W), '
                             f'got {tuple(x.shape)}: check in_channels against the backbone\'s out_channels')
        b, c, h, w = x.shape
        tokens = layer_norm(self.norm, self.block(x.flatten(2).transpose(1, 2)))  # (B, H*W, C)
        return (*inputs[:-1], tokens.transpose(1, 2).reshape(b, c, h, w))
