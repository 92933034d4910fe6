"""PoolFormer checkpoint conversion: official and mmpretrain layouts -> the plugin's layout (pure functions).

The official files (``poolformer_s12.pth.tar``: a raw classifier state dict; dense checkpoints of the official
``fork_feat`` backbone: ``backbone.`` prefix) and mmpretrain's ``PoolFormer`` files share one set of names:
``patch_embed.proj``, ``network.{0..6}.*`` (stages at even indices, downsample ``proj`` convs at odd ones),
``norm1`` / ``norm2`` / ``mlp.fc1`` / ``mlp.fc2`` / ``layer_scale_{1,2}`` per block, output norms
``norm{0,2,4,6}``. The plugin layout names the output norms by stage, ``norm{0..3}``. A classifier's final norm
(official ``norm``; mmpretrain's ``norm6`` in a file without the other output norms) and its ``head`` are dropped,
as the official ``fork_feat`` loader ignores them.
"""
from __future__ import annotations

import re

import torch

from mmplugin.checkpoint import CheckpointError
from mmplugin.checkpoint.convert import route_output_norms

__all__ = ['is_poolformer', 'convert_poolformer']


def is_poolformer(sd: dict[str, torch.Tensor]) -> bool:
    """PoolFormer in any layout: GroupNorm-ed blocks (``network.*.norm1``) with 1x1-conv MLPs (4-D ``mlp.fc1``
    weights) and no BatchNorm inside the MLP (EfficientFormer) nor an additive attention (SwiftFormer)."""
    if any(k.endswith('attn.w_g') or '.mlp.norm1.' in k for k in sd):
        return False
    return any(re.match(r'(?:.*\.)?network\.\d+\.\d+\.norm1\.weight$', k) for k in sd) and any(
        re.match(r'(?:.*\.)?network\.\d+\.\d+\.mlp\.fc1\.weight$', k) and v.dim() == 4 for k, v in sd.items())


def convert_poolformer(sd: dict[str, torch.Tensor], out_indices=(0, 1, 2, 3),
                       copy_classifier_norm: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Convert a PoolFormer state dict (official, mmpretrain or plugin layout) to the plugin layout.

    Args:
        sd: unwrapped state dict (see :func:`mmplugin.checkpoint.convert.unwrap_state_dict`).
        out_indices: the target model's outputs; decides which output norms exist.
        copy_classifier_norm: initialise ``norm3`` from the classifier's final GroupNorm (same stage-3 features).
            Defaults to False: the official dense backbone leaves the output norms fresh.

    Returns:
        ``(converted, dropped)``.

    Raises:
        CheckpointError: not a PoolFormer checkpoint (see :func:`mmplugin.checkpoint.convert.route_output_norms`
            for ``copy_classifier_norm``).
    """
    if not is_poolformer(sd):
        raise CheckpointError(f'not a PoolFormer checkpoint (no network.*.norm1 / 1x1-conv mlp.fc1 keys; first keys: '
                              f'{list(sd)[:5]})')
    # official dense files hold all of norm0/2/4/6, classifiers none (mmpretrain's: norm6): output norms without
    # norm4 / norm6 are the plugin's own, named by stage
    plugin = any(re.match(r'norm[0-3]\.', k) for k in sd) and not any(re.match(r'norm[46]\.', k) for k in sd)
    # mmpretrain classifiers keep their final norm as norm6 (their out_indices=(6,)), without norm0
    classifier_norm6 = any(k.startswith('norm6.') for k in sd) and not any(k.startswith('norm0.') for k in sd)
    dropped = [k for k in sd if k.startswith('head.')]
    out = {}
    for k, v in sd.items():
        if k.startswith('head.'):
            continue
        m = re.match(r'norm([0246])\.(.*)', k)
        if m and not plugin:
            idx = int(m.group(1))
            k = f'norm.{m.group(2)}' if classifier_norm6 and idx == 6 else f'norm{idx // 2}.{m.group(2)}'
        out[k] = v
    out, more = route_output_norms(out, out_indices, copy_classifier_norm=copy_classifier_norm)
    return out, dropped + more
