"""Initialisation shared by the transformer layers."""
from __future__ import annotations

from mmengine.model.weight_init import trunc_normal_
from torch import nn


def transformer_init_(module: nn.Module) -> nn.Module:
    """The ViT / Swin initialisation, in place: truncated-normal (std 0.02) linear weights, zero linear biases,
    LayerNorms at weight 1 and bias 0. Returns ``module``."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return module
