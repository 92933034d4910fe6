"""Layer-wise learning-rate decay for the plugin's Swin backbones (Swin V2 paper A1.2: decay 0.95 for ADE20K)."""
from __future__ import annotations

import re

from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn

from .registry import OPTIM_WRAPPER_CONSTRUCTORS


def swin_layer_id(name: str, depths: list[int]) -> int:
    """Depth index of a parameter: 0 patch embedding, 1..sum(depths) blocks in order, sum(depths) + 1 everything
    outside the backbone. A stage's patch merging and output norm share its last block's index."""
    if name.startswith('backbone.patch_embed'):
        return 0
    m = re.match(r'backbone\.layers\.(\d+)\.blocks\.(\d+)\.', name)
    if m:
        i, j = int(m.group(1)), int(m.group(2))
        return sum(depths[:i]) + j + 1
    m = re.match(r'backbone\.(?:layers\.(\d+)\.downsample|norm(\d+))\.', name)
    if m:
        i = int(m.group(1) or m.group(2))
        return sum(depths[:i + 1])
    return sum(depths) + 1


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` plus ``paramwise_cfg.layer_decay_rate``: a parameter at depth ``l`` (see
    :func:`swin_layer_id`) gets ``lr * rate ** (L - l)`` with ``L = sum(depths) + 1``; custom_keys still apply."""

    def add_params(self, params: list, module: nn.Module, prefix: str = '', **kwargs) -> None:
        rate = float(self.paramwise_cfg.get('layer_decay_rate', 1.0))
        cfg = {k: v for k, v in self.paramwise_cfg.items() if k != 'layer_decay_rate'}
        saved, self.paramwise_cfg = self.paramwise_cfg, cfg
        start = len(params)
        try:
            super().add_params(params, module, prefix=prefix, **kwargs)
        finally:
            self.paramwise_cfg = saved
        if prefix or rate == 1.0:
            return
        backbone = getattr(module, 'backbone', None)
        depths = list(getattr(backbone, 'depths', []))
        if not depths:
            raise ValueError('layer_decay_rate needs a model with a backbone that declares depths')
        total = sum(depths) + 1
        for group, (name, _) in zip(params[start:], module.named_parameters()):
            group['lr'] = group.get('lr', self.base_lr) * rate**(total - swin_layer_id(name, depths))
