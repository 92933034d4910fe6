"""EfficientFormer (V1) checkpoint conversion: official and mmpretrain layouts -> the plugin's layout (pure functions).

Plugin layout = the official ``*_feat`` layout (``patch_embed.{0,1,3,4}``, ``network.{0..6}.*``, block parameters
``layer_scale_{1,2}``, ``mlp.{fc1,norm1,fc2,norm2}``, ``token_mixer.{qkv,proj,attention_biases_seg}``) with the
output norms named by stage, ``norm{0..3}`` instead of ``norm{0,2,4,6}``. Layouts read:

* ``official``: ImageNet classifiers (``efficientformer_l1_300d.pth``: ``'model'`` container, ``norm`` / ``head`` /
  ``dist_head`` dropped; the 7x7 ``attention_biases`` of classification are dropped too: the dense model starts its
  ``attention_biases_seg`` from zero, as the official code does) and the dense checkpoints trained with the
  official ``*_feat`` backbones (``backbone.`` prefix; ``attention_biases_seg`` kept, the unused classification
  bias buffers and the derived index buffers dropped);
* ``mmpretrain``: ``mmpretrain.EfficientFormer`` files (``patch_embed.{0,1}.{conv,bn}``, downsamples as the first
  block of a stage, ``ls{1,2}.weight``, ``head.head`` / ``head.dist_head``; a file with ``norm3`` alone is an
  ImageNet classifier whose ``norm3`` is the final LayerNorm: dropped like the official ``norm``);
* ``plugin``: this layout.
"""
from __future__ import annotations

import re

import torch

from mmplugin.checkpoint import CheckpointError
from mmplugin.checkpoint.convert import route_output_norms

__all__ = ['detect_efficientformer_layout', 'convert_efficientformer', 'is_efficientformer']

_CLASSIFIER = ('head.', 'dist_head.')
#: buffers of the official feat model that are derived (index tables) or unused by it (the classification bias)
_DERIVED = ('attention_bias_idxs', 'attention_bias_idxs_seg', 'attention_biases')


def is_efficientformer(sd: dict[str, torch.Tensor]) -> bool:
    """EfficientFormer V1 in any layout: a 4-D block's ConvMlp BatchNorm (``mlp.norm1.running_var``) inside
    ``network``, and no SwiftFormer additive attention (``attn.w_g``), whose official layout shares these names."""
    if any(k.endswith('attn.w_g') for k in sd):
        return False
    return any(re.match(r'(?:.*\.)?network\.\d+\.\d+\.mlp\.norm1\.running_var$', k) for k in sd)


def detect_efficientformer_layout(sd: dict[str, torch.Tensor]) -> str:
    """``'official'``, ``'mmpretrain'`` or ``'plugin'``; raises :class:`CheckpointError` for anything else."""
    keys = list(sd)
    if not is_efficientformer(sd):
        raise CheckpointError('not an EfficientFormer checkpoint (no network.*.mlp.norm1 keys; '
                              f'first keys: {keys[:5]})')
    if any(re.match(r'patch_embed\.\d\.(conv|bn)\.', k) for k in keys) or any(k.endswith('.ls1.weight')
                                                                               for k in keys):
        return 'mmpretrain'
    if any(re.match(r'norm[0-3]\.', k) for k in keys) and not any(re.match(r'norm[46]\.', k) for k in keys) \
            and not any(k.endswith(_DERIVED) for k in keys):
        return 'plugin'
    return 'official'


def _from_mmpretrain(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mmpretrain -> official names: stem ConvModules, downsamples out of the stages, layer scales."""
    # the blocks of stage i in mmpretrain start with its downsample when stage i has one (i >= 1)
    has_down = {int(m.group(1)) for k in sd if (m := re.match(r'network\.(\d+)\.0\.conv\.', k))}
    # an ImageNet classifier file of mmpretrain holds norm3 only: the classifier's LayerNorm over tokens
    classifier_norm = any(k.startswith('norm3.') for k in sd) and not any(k.startswith('norm0.') for k in sd)
    out = {}
    for k, v in sd.items():
        k = re.sub(r'^patch_embed\.0\.conv\.', 'patch_embed.0.', k)
        k = re.sub(r'^patch_embed\.0\.bn\.', 'patch_embed.1.', k)
        k = re.sub(r'^patch_embed\.1\.conv\.', 'patch_embed.3.', k)
        k = re.sub(r'^patch_embed\.1\.bn\.', 'patch_embed.4.', k)
        m = re.match(r'network\.(\d+)\.(\d+)\.(.*)', k)
        if m:
            i, j, rest = int(m.group(1)), int(m.group(2)), m.group(3)
            if i in has_down and j == 0:
                rest = rest.replace('conv.', 'proj.', 1).replace('bn.', 'norm.', 1)
                k = f'network.{2 * i - 1}.{rest}'
            else:
                k = f'network.{2 * i}.{j - (1 if i in has_down else 0)}.{rest}'
        k = re.sub(r'\.ls([12])\.(?:weight|gamma)$', r'.layer_scale_\1', k)
        m = re.match(r'norm([0-3])\.(.*)', k)
        if m:
            k = f'norm.{m.group(2)}' if classifier_norm else f'norm{2 * int(m.group(1))}.{m.group(2)}'
        k = re.sub(r'^head\.head\.', 'head.', k)
        k = re.sub(r'^head\.dist_head\.', 'dist_head.', k)
        out[k] = v
    return out


def convert_efficientformer(sd: dict[str, torch.Tensor], out_indices=(0, 1, 2, 3),
                            copy_classifier_norm: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Convert an EfficientFormer V1 state dict of any supported layout to the plugin layout.

    Args:
        sd: unwrapped state dict (see :func:`mmplugin.checkpoint.convert.unwrap_state_dict`).
        out_indices: the target model's outputs; decides which output norms exist.
        copy_classifier_norm: must stay False: the classifier's final norm is a LayerNorm over tokens, the output
            norms are GroupNorms over maps.

    Returns:
        ``(converted, dropped)``: the plugin-layout dict and the source keys left out.

    Raises:
        CheckpointError: not an EfficientFormer checkpoint, or ``copy_classifier_norm`` was asked for.
    """
    if copy_classifier_norm:
        raise CheckpointError('EfficientFormer: copy_classifier_norm is not available (the classifier norm is a '
                              'LayerNorm over tokens; the output norms are GroupNorm(1, C) over maps)')
    layout = detect_efficientformer_layout(sd)
    if layout == 'plugin':
        return route_output_norms(sd, out_indices)
    if layout == 'mmpretrain':
        sd = _from_mmpretrain(sd)
    dropped = [k for k in sd if k.startswith(_CLASSIFIER) or k.endswith(_DERIVED)]
    out = {}
    for k, v in sd.items():
        if k.startswith(_CLASSIFIER) or k.endswith(_DERIVED):
            continue
        m = re.match(r'norm([0246])\.(.*)', k)
        if m:
            k = f'norm{int(m.group(1)) // 2}.{m.group(2)}'
        out[k] = v
    out, more = route_output_norms(out, out_indices)
    return out, dropped + more
