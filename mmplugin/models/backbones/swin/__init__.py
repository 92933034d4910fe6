"""Swin Transformer V1 / V2, in one place.

* :mod:`.model`: :class:`SwinTransformer` and :class:`SwinTransformerV2` (registered backbones);
* :mod:`.blocks`: the shifted-window block, MLP, patch merging and stage;
* :mod:`.attention`: window attention (V1 bias table, V2 cosine attention with the log-spaced CPB MLP);
* :mod:`.windows`: window geometry (padding, shifts, the attention mask) and index caches;
* :mod:`.patchify`: the stride-4 patch embedding as one GEMM;
* :mod:`.keywords`: mmdet / mmseg / mmpretrain keyword translation;
* :mod:`.converter`: official, timm, HF, mmdet / mmseg and mmpretrain checkpoint layouts to the plugin's.
"""
from __future__ import annotations

from mmplugin.models.backbones.swin.converter import (
    convert_swin,
    detect_swin_layout,
    detect_swin_version,
    resize_bias_table,
)
from mmplugin.models.backbones.swin.model import SwinTransformer, SwinTransformerV2

__all__ = ['convert_swin', 'detect_swin_layout', 'detect_swin_version', 'resize_bias_table', 'SwinTransformer',
           'SwinTransformerV2']
