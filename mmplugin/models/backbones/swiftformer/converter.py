"""SwiftFormer checkpoint conversion: official release and timm layouts -> the plugin's layout (pure functions).

Plugin layout: ``stem.{0,1,3,4}``, ``stages.{k}.downsample.{proj,norm}`` (k >= 1), ``stages.{k}.blocks.{j}.*``
(official block parameter names, ``attn.proj`` lower-case), output norms ``norm{k}``.
"""
from __future__ import annotations

import re

import torch

from mmplugin.checkpoint import CheckpointError
from mmplugin.checkpoint.convert import rename_keys, route_output_norms

__all__ = ['detect_swiftformer_layout', 'convert_swiftformer']

_CLASSIFIER = ('head.', 'dist_head.', 'head_dist.')


def detect_swiftformer_layout(sd: dict[str, torch.Tensor]) -> str:
    """``'official'``, ``'timm'`` or ``'plugin'``; raises :class:`CheckpointError` for anything else."""
    keys = list(sd)
    if not any(k.endswith('attn.w_g') for k in keys):  # the additive attention exists in every layout
        raise CheckpointError('not a SwiftFormer checkpoint (no additive-attention attn.w_g key; first keys: '
                              f'{keys[:5]})')
    if any(k.startswith('network.') for k in keys) and any(k.startswith('patch_embed.') for k in keys):
        return 'official'
    if any(k.startswith('stem.') for k in keys) and any(k.startswith('stages.') for k in keys):
        if any(k.endswith('.gamma') for k in keys) or any(k.startswith('head_dist.') for k in keys):
            return 'timm'
        if any('.blocks.' in k and ('attn.w_g' in k or 'layer_scale' in k) for k in keys):
            return 'plugin'
    raise CheckpointError('not a SwiftFormer checkpoint (no official, timm or mmplugin SwiftFormer keys; '
                          f'first keys: {keys[:5]})')


def convert_swiftformer(sd: dict[str, torch.Tensor], out_indices=(0, 1, 2, 3),
                        copy_classifier_norm: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Convert a SwiftFormer state dict of any supported layout to the plugin layout.

    Args:
        sd: unwrapped state dict (see :func:`mmplugin.checkpoint.convert.unwrap_state_dict`).
        out_indices: the target model's outputs; decides which output norms exist.
        copy_classifier_norm: initialise the last output norm ``norm3`` from an ImageNet classifier's final
            ``norm`` (a BatchNorm on the same stage-4 features). Defaults to False: ``norm.*`` is dropped and
            ``norm3`` starts fresh, as the official ``fork_feat`` loader (``load_state_dict(..., False)``) does.

    Returns:
        ``(converted, dropped)``: the plugin-layout dict and the source keys left out (classifier heads, ...).

    Raises:
        CheckpointError: not a SwiftFormer checkpoint, or ``copy_classifier_norm`` cannot be honoured (see
            :func:`mmplugin.checkpoint.convert.route_output_norms`).
    """
    layout = detect_swiftformer_layout(sd)
    dropped = [k for k in sd if k.startswith(_CLASSIFIER)]
    sd = {k: v for k, v in sd.items() if not k.startswith(_CLASSIFIER)}
    if layout == 'official':
        out = {}
        for k, v in sd.items():
            m = re.match(r'network\.(\d+)\.(.*)', k)
            if m:
                n, rest = int(m.group(1)), m.group(2)
                k = f'stages.{n // 2}.blocks.{rest}' if n % 2 == 0 else f'stages.{n // 2 + 1}.downsample.{rest}'
            else:
                fm = re.match(r'norm([0246])\.(.*)', k)  # fork_feat output norms norm0/2/4/6
                if fm:
                    k = f'norm{int(fm.group(1)) // 2}.{fm.group(2)}'
            out[k] = v
        sd = rename_keys(out, [(r'^patch_embed\.', 'stem.'), (r'\.attn\.Proj\.', '.attn.proj.')])
    elif layout == 'timm':
        sd = {(k[:-len('.gamma')] if k.endswith('.gamma') else k): v for k, v in sd.items()}
        sd = {k: (v.reshape(-1, 1, 1) if 'layer_scale' in k and v.ndim == 1 else v) for k, v in sd.items()}
    sd, more = route_output_norms(sd, out_indices, copy_classifier_norm=copy_classifier_norm)
    return sd, dropped + more
