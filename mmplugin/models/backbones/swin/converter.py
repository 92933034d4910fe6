"""Swin V1/V2 checkpoint conversion to the plugin layout (pure functions).

The plugin keeps the official parameter names (``patch_embed.proj``, ``layers.{i}.blocks.{j}.attn.qkv``,
``layers.{i}.downsample`` at the end of stage i, official patch-merging channel order) plus output norms
``norm{i}``. Supported sources, auto-detected:

* ``official``: microsoft/Swin-Transformer V1 and V2 releases (and this plugin's own files);
* ``timm``: ``layers.{i}.downsample`` at the *start* of stage i (i >= 1), ``head.fc``;
* ``openmmlab``: mmdet / mmseg / mmpretrain (``stages``, ``attn.w_msa``, ``ffn.layers``, ``nn.Unfold`` merge
  order; mmpretrain V2 puts the merge at the start of the next stage).

Derived buffers (``relative_position_index``, ``relative_coords_table``, ``attn_mask``) are dropped: the model
regenerates them for its own window and ``pretrained_window_size``. V1 bias tables are resized bicubically
when the checkpoint's window differs from the model's.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from mmplugin.checkpoint import CheckpointError
from mmplugin.checkpoint.convert import rename_keys, route_output_norms

__all__ = ['detect_swin_layout', 'detect_swin_version', 'convert_swin', 'resize_bias_table', 'unfold_to_official',
           'official_to_unfold', 'plugin_to_mmdet_swin', 'num_swin_stages']

_DERIVED = ('relative_position_index', 'relative_coords_table', 'attn_mask', 'k_bias')
_MERGE_PERM = [0, 2, 1, 3]  # unfold kernel position (r*2+c) <-> official block order [(0,0),(1,0),(0,1),(1,1)]


def detect_swin_version(sd: dict[str, torch.Tensor]) -> int:
    if any(k.endswith('relative_position_bias_table') for k in sd):
        return 1
    if any('cpb_mlp' in k or k.endswith('logit_scale') for k in sd):
        return 2
    raise CheckpointError(f'not a Swin checkpoint (no relative position bias table or CPB MLP; first keys: '
                          f'{list(sd)[:5]})')


def detect_swin_layout(sd: dict[str, torch.Tensor]) -> str:
    keys = list(sd)
    if any(k.startswith('stages.') and '.w_msa.' in k for k in keys):
        return 'openmmlab'
    if any(k.startswith('layers.') for k in keys):
        if any(k.startswith('head.fc.') for k in keys) or (
                not any(k.startswith('layers.0.downsample.') for k in keys)
                and any(k.startswith('layers.1.downsample.') for k in keys)):
            return 'timm'
        return 'official'
    raise CheckpointError(f'not a Swin checkpoint (first keys: {keys[:5]})')


def unfold_to_official(w: torch.Tensor) -> torch.Tensor:
    """Reorder the 4C input axis (last) from ``nn.Unfold`` order (``c*4 + k``) to the official block order."""
    *lead, n = w.shape
    c = n // 4
    return w.reshape(*lead, c, 4).transpose(-1, -2)[..., _MERGE_PERM, :].reshape(*lead, n)


def official_to_unfold(w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unfold_to_official` (used to build mmdet-layout weights)."""
    *lead, n = w.shape
    c = n // 4
    return w.reshape(*lead, 4, c)[..., _MERGE_PERM, :].transpose(-1, -2).reshape(*lead, n)


def resize_bias_table(table: torch.Tensor, window_size: int, key: str = '') -> torch.Tensor:
    """Bicubically resize a ``((2w-1)^2, heads)`` V1 bias table to window ``window_size``."""
    n, heads = table.shape
    src = math.isqrt(n)
    dst = 2 * window_size - 1
    if src * src != n:
        raise CheckpointError(f'{key}: bias table of shape {tuple(table.shape)} is not square and cannot be resized')
    if src == dst:
        return table
    grid = table.t().reshape(1, heads, src, src).float()
    out = F.interpolate(grid, size=(dst, dst), mode='bicubic', align_corners=False)
    return out.reshape(heads, dst * dst).t().to(table.dtype).contiguous()


def num_swin_stages(sd: dict[str, torch.Tensor], prefix: str = 'layers') -> int:
    """Number of stages with blocks in ``sd`` (``{prefix}.{i}.blocks.*``); 0 when there are none."""
    found = [int(m.group(1)) for m in (re.match(rf'{prefix}\.(\d+)\.blocks\.', k) for k in sd) if m]
    return max(found) + 1 if found else 0


def _from_openmmlab(sd: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    # mmpretrain V2 merges at the start of stages 1..n-1: the last stage has a downsample, or stage 1 has one and
    # stage 0 has none; mmdet / mmseg / mmpretrain V1 merge at the end of stages 0..n-2 (any number of stages)
    last = num_swin_stages(sd, 'stages') - 1
    merge_at_start = any(k.startswith(f'stages.{last}.downsample.') for k in sd) or (
        not any(k.startswith('stages.0.downsample.') for k in sd) and any(k.startswith('stages.1.downsample.')
                                                                          for k in sd))
    out = {}
    for k, v in sd.items():
        m = re.match(r'stages\.(\d+)\.downsample\.(.*)', k)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            i = i - 1 if merge_at_start else i
            if rest == 'reduction.weight':
                v = unfold_to_official(v)
            elif rest.startswith('norm.') and version == 1:
                v = unfold_to_official(v)
            k = f'layers.{i}.downsample.{rest}'
        out[k] = v
    return rename_keys(out, [(r'^stages\.', 'layers.'), (r'\.attn\.w_msa\.', '.attn.'),
                             (r'\.ffn\.layers\.0\.0\.', '.mlp.fc1.'), (r'\.ffn\.layers\.1\.', '.mlp.fc2.'),
                             (r'^patch_embed\.projection\.', 'patch_embed.proj.')])


def _from_timm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        m = re.match(r'layers\.(\d+)\.downsample\.(.*)', k)
        if m:
            k = f'layers.{int(m.group(1)) - 1}.downsample.{m.group(2)}'
        out[k] = v
    return out


def convert_swin(sd: dict[str, torch.Tensor], version: int = 1, window_sizes=None, out_indices=(0, 1, 2, 3),
                 copy_classifier_norm: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Convert a Swin state dict of any supported layout (any number of stages) to the plugin layout.

    Args:
        sd: unwrapped state dict.
        version: the target model's version (1 or 2); a checkpoint of the other version is refused.
        window_sizes: the target model's window per stage (V1 bias tables are resized to it); None keeps them.
        out_indices: the target model's outputs; decides which output norms exist.
        copy_classifier_norm: initialise the output norm of the checkpoint's last stage (``norm3`` for the
            released 4-stage classifiers) from an ImageNet classifier's final ``norm``. Defaults to False:
            ``norm.*`` is dropped and that output norm starts fresh (weight 1, bias 0), as in mmdet / mmseg and the
            official Swin detection and segmentation code, which load with ``strict=False``.

    Returns:
        ``(converted, dropped)``.

    Raises:
        CheckpointError: not a Swin checkpoint, the other Swin version, or ``copy_classifier_norm`` cannot be
            honoured (see :func:`mmplugin.checkpoint.convert.route_output_norms`).
    """
    src_version = detect_swin_version(sd)
    if src_version != version:
        raise CheckpointError(f'this is a Swin V{src_version} checkpoint but the model is Swin V{version}; use '
                              f'mmplugin.{"SwinTransformerV2" if src_version == 2 else "SwinTransformer"}')
    layout = detect_swin_layout(sd)
    dropped = [k for k in sd if k.startswith('head.') or k.split('.')[-1] in _DERIVED]
    sd = {k: v for k, v in sd.items() if k not in set(dropped)}
    if layout == 'openmmlab':
        sd = _from_openmmlab(sd, version)
    elif layout == 'timm':
        sd = _from_timm(sd)
    sd, more = route_output_norms(sd, out_indices, num_stages=num_swin_stages(sd) or 4,
                                  copy_classifier_norm=copy_classifier_norm)
    dropped += more
    if version == 1 and window_sizes is not None:
        for k in [k for k in sd if k.endswith('relative_position_bias_table')]:
            stage = int(k.split('.')[1])
            if stage < len(window_sizes):
                sd[k] = resize_bias_table(sd[k], window_sizes[stage], k)
    return sd, dropped


def plugin_to_mmdet_swin(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plugin (official-name) Swin V1 state dict -> mmdet / mmseg ``SwinTransformer`` layout (no prefix).

    The inverse of the ``openmmlab`` branch of :func:`convert_swin`: used to run mmdet's Swin with the plugin's
    weights (``tools/benchmark.py``) and to hand weights back to stock mmdet / mmseg.
    """
    out = {}
    for k, v in sd.items():
        if '.downsample.reduction.' in k or '.downsample.norm.' in k:
            v = official_to_unfold(v)
        k = re.sub(r'^layers\.', 'stages.', k)
        k = k.replace('.attn.', '.attn.w_msa.').replace('.mlp.fc1.', '.ffn.layers.0.0.')
        k = k.replace('.mlp.fc2.', '.ffn.layers.1.').replace('patch_embed.proj.', 'patch_embed.projection.')
        out[k] = v
    return out
