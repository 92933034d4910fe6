"""Convolutional blocks of SwiftFormer on NCHW maps (any memory format): the convolutional encoder, the
encoder's local representation and conv MLP, and the stride-2 conv-norm used by the stem and the downsamples.

In eval mode every BatchNorm that uses running statistics is folded into its neighbouring conv on the fly, and
layer scales into the last conv of their branch (exact algebra, ~1e-7 relative); ``switch_to_deploy()`` makes
those folds permanent. Parameter names follow the official SwiftFormer release.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from torch import nn

from mmplugin.models.layers.drop import DropPath
from mmplugin.models.layers.fusion import (
    add_residual,
    conv_act,
    conv_add,
    conv_bn,
    folded_bn_conv1x1,
    fuse_bn_conv1x1,
    fuse_conv_bn,
    plain_1x1,
    scale_output_,
    uses_running_stats,
)
from mmplugin.models.layers.recompute import recompute_applies
from mmplugin.models.layers.recompute_conv import gelu_conv1x1

__all__ = ['ConvEncoder', 'LocalRepresentation', 'ConvMlp', 'ConvNormAct', 'norm_layer']


def norm_layer(norm_cfg: dict, c: int) -> nn.Module:
    """The norm module that ``norm_cfg`` (an mmcv norm config, e.g. ``dict(type="BN")``) builds for ``c`` channels."""
    return build_norm_layer(norm_cfg, c)[1]


def _scaled_weights(conv: nn.Conv2d, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of ``scale * conv(.)`` for a per-channel ``scale`` of shape ``(C, 1, 1)`` (or None)."""
    if scale is None:
        return conv.weight, conv.bias
    s = scale.reshape(-1)
    return conv.weight * s.view(-1, 1, 1, 1), None if conv.bias is None else conv.bias * s


def _residual_conv(y: torch.Tensor, conv: nn.Conv2d, scale: torch.Tensor | None, x: torch.Tensor,
                   drop_path: nn.Module) -> torch.Tensor:
    """``x + drop_path(scale * conv(y))``; one fused kernel at inference."""
    w, b = _scaled_weights(conv, scale)
    if drop_path.training and drop_path.p > 0:
        return add_residual(drop_path(F.conv2d(y, w, b)), x)
    return conv_add(y, conv, x, w, b)


def _mlp_residual(y: torch.Tensor, fc1: nn.Conv2d, fc2: nn.Conv2d, scale: torch.Tensor | None, x: torch.Tensor,
                  drop_path: nn.Module, w1: torch.Tensor | None = None, b1: torch.Tensor | None = None) -> torch.Tensor:
    """``x + drop_path(scale * fc2(GELU(fc1(y))))`` for 1x1 ``fc1`` / ``fc2`` (``w1`` / ``b1`` replace fc1's own,
    e.g. with a BatchNorm folded in): fused oneDNN kernels at inference; in eager CPU training the hidden map is kept
    once, ``GELU(h)`` recomputed in the backward (:func:`~mmplugin.models.layers.recompute_conv.gelu_conv1x1`)."""
    w1, b1 = (fc1.weight, fc1.bias) if w1 is None else (w1, b1)
    if plain_1x1(fc2) and recompute_applies(y, w1, b1, fc2.weight, fc2.bias, scale):
        h = F.conv2d(y, w1, b1, fc1.stride, fc1.padding, fc1.dilation, fc1.groups)
        return add_residual(drop_path(gelu_conv1x1(h, *_scaled_weights(fc2, scale))), x)
    return _residual_conv(conv_act(y, fc1, 'gelu', w1, b1), fc2, scale, x, drop_path)


class ConvEncoder(nn.Module):
    """Convolutional encoder: ``x + ls * pw2(GELU(pw1(BN(dw3x3(x)))))``. Shapes ``(B, C, H, W)`` in and out.

    Args:
        dim (int): channels C.
        mlp_ratio (float): hidden width factor of the pointwise convs.
        norm_cfg (dict): norm after the depth-wise conv.
        drop_path (float): stochastic depth (0 in the official schedule).
    """

    def __init__(self, dim: int, mlp_ratio: float = 4.0, norm_cfg: dict | None = None, drop_path: float = 0.0):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = norm_layer(norm_cfg or dict(type='BN'), dim)
        self.pwconv1 = nn.Conv2d(dim, hidden, 1)
        self.pwconv2 = nn.Conv2d(hidden, dim, 1)
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = conv_bn(x, self.dwconv, self.norm)
        return _mlp_residual(y, self.pwconv1, self.pwconv2, self.layer_scale, x, self.drop_path)

    @torch.no_grad()
    def switch_to_deploy(self) -> None:
        if uses_running_stats(self.norm):
            self.dwconv = fuse_conv_bn(self.dwconv, self.norm)
            self.norm = nn.Identity()
        if self.layer_scale is not None:
            scale_output_(self.pwconv2, self.layer_scale)
            self.layer_scale = None


class LocalRepresentation(ConvEncoder):
    """``x + ls * pw2(GELU(pw1(BN(dw3x3(x)))))`` with a C-wide hidden layer (the encoder's local mixing)."""

    def __init__(self, dim: int, norm_cfg: dict):
        super().__init__(dim, mlp_ratio=1.0, norm_cfg=norm_cfg)


class ConvMlp(nn.Module):
    """``fc2(GELU(fc1(BN(x))))`` with 1x1 convs; the BatchNorm comes first, as in the official code."""

    def __init__(self, dim: int, hidden: int, norm_cfg: dict):
        super().__init__()
        self.norm1 = norm_layer(norm_cfg, dim)
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward_residual(self, x: torch.Tensor, out_scale: torch.Tensor | None,
                         drop_path: nn.Module) -> torch.Tensor:
        """``x + drop_path(out_scale * fc2(GELU(fc1(BN(x)))))``; BN and scale folded at inference."""
        if uses_running_stats(self.norm1):
            w1, b1 = folded_bn_conv1x1(self.norm1, self.fc1)
            return _mlp_residual(x, self.fc1, self.fc2, out_scale, x, drop_path, w1, b1)
        return _mlp_residual(self.norm1(x), self.fc1, self.fc2, out_scale, x, drop_path)

    @torch.no_grad()
    def switch_to_deploy(self, out_scale: torch.Tensor | None) -> None:
        if uses_running_stats(self.norm1):
            self.fc1 = fuse_bn_conv1x1(self.norm1, self.fc1)
            self.norm1 = nn.Identity()
        if out_scale is not None:
            scale_output_(self.fc2, out_scale)


class ConvNormAct(nn.Module):
    """3x3 stride-2 conv, BatchNorm, optional ReLU: the stem halves and the downsamples between stages."""

    def __init__(self, cin: int, cout: int, norm_cfg: dict, act: bool):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, 3, stride=2, padding=1)
        self.norm = norm_layer(norm_cfg, cout)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_bn(x, self.proj, self.norm, 'relu' if self.act else None)

    @torch.no_grad()
    def switch_to_deploy(self) -> None:
        if uses_running_stats(self.norm):
            self.proj = fuse_conv_bn(self.proj, self.norm)
            self.norm = nn.Identity()
