"""Layer-wise learning-rate decay for any plugin backbone (Swin V2 paper A1.2: decay 0.95 for ADE20K)."""
from __future__ import annotations

from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn

from mmplugin.registry import OPTIM_WRAPPER_CONSTRUCTORS


def layer_depth(model: nn.Module, name: str) -> tuple[int, int]:
    """``(depth, max_depth)`` of parameter ``name`` of a detector / segmentor with a plugin backbone.

    Backbone parameters (``backbone.*``) get the backbone family's :meth:`~BaseBackbone.layer_depth`; everything
    else (neck, heads) gets ``max_depth = backbone.num_layers - 1`` and so the full learning rate.

    Raises:
        ValueError: the model has no backbone that declares layer depths.
    """
    from mmplugin.models.backbones.base import BaseBackbone
    backbone = getattr(model, 'backbone', None)
    if not isinstance(backbone, BaseBackbone):
        raise ValueError('paramwise_cfg.layer_decay_rate needs a model whose backbone is a plugin backbone '
                         f'(got {type(backbone).__name__}); remove layer_decay_rate for other backbones')
    top = backbone.num_layers - 1  # raises NotImplementedError with a message for families without depths
    if name.startswith('backbone.'):
        return backbone.layer_depth(name[len('backbone.'):]), top
    return top, top


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` plus ``paramwise_cfg.layer_decay_rate``: a parameter at depth ``l`` (see
    :func:`layer_depth`) gets ``lr * rate ** (L - l)`` with ``L`` the deepest index; custom_keys still apply."""

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
        if not 0.0 < rate <= 1.0:
            raise ValueError(f'paramwise_cfg.layer_decay_rate must be in (0, 1], got {rate}')
        for group, (name, _) in zip(params[start:], module.named_parameters()):
            depth, top = layer_depth(module, name)
            group['lr'] = group.get('lr', self.base_lr) * rate**(top - depth)
