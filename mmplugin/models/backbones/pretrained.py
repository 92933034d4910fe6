"""Pretrained weights for the plugin's backbones: the deprecated OpenMMLab ``pretrained=`` argument, and loading
``init_cfg=dict(type='Pretrained', checkpoint=PATH[, prefix='backbone.'])``.

The checkpoint is read with weights-only semantics, unwrapped from any container, converted by the family's pure
converter from whichever published layout it has, checked key by key against the model (:func:`plan_load`), and
only then loaded: a checkpoint that does not fit raises :class:`CheckpointError` before the model changes.
"""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

import torch
from mmengine.logging import print_log

from mmplugin.checkpoint import CheckpointError, load_checkpoint_file
from mmplugin.checkpoint.convert import plan_load, unwrap_state_dict
from mmplugin.utils.errors import ConfigTypeError, ConfigValueError

__all__ = ['PretrainedMixin', 'resolve_pretrained']

_RESNET_ALIASES = ('open-mmlab://', 'torchvision://', 'mmcls://', 'mmpretrain://', 'modelzoo://')


def resolve_pretrained(owner: str, pretrained, init_cfg):
    """The deprecated OpenMMLab ``pretrained=`` argument, read as mmdet / mmseg do; returns the ``init_cfg`` to use.

    * a path or URL: ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)`` (with mmdet's deprecation warning);
    * a ResNet model-zoo alias (``open-mmlab://``, ``torchvision://``, ...), which an mmseg / mmdet base config's
      ``model.pretrained`` hands to every backbone: ignored, with one warning that says so;
    * ``None``: nothing.
    """
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise ConfigTypeError(f'{owner}: pretrained must be a str (path or URL) or None, '
                              f'got {type(pretrained).__name__}')
    if pretrained.startswith(_RESNET_ALIASES):
        warnings.warn(f'{owner}: ignoring pretrained={pretrained!r}, a model-zoo alias for another backbone. It '
                      'usually comes from a base config\'s model.pretrained (e.g. mmseg\'s _base_/models/*.py); set '
                      'model.pretrained=None to silence this, and give this backbone\'s weights with '
                      'init_cfg=dict(type=\'Pretrained\', checkpoint=...).', UserWarning, stacklevel=3)
        return init_cfg
    if init_cfg is not None:
        raise ConfigValueError(f'{owner}: init_cfg and pretrained cannot be set at the same time (pretrained is '
                         'deprecated: use init_cfg=dict(type=\'Pretrained\', checkpoint=...))')
    warnings.warn('DeprecationWarning: pretrained is deprecated, please use "init_cfg" instead', UserWarning,
                  stacklevel=3)
    return dict(type='Pretrained', checkpoint=pretrained)


class PretrainedMixin:
    """Checkpoint conversion and ``init_cfg`` loading of a :class:`~.base.BaseBackbone` (mixed in before
    ``BaseModule``, whose ``init_weights`` runs when no checkpoint is given).

    Uses the family's :attr:`converter`, :meth:`public_name`, :meth:`_default_init`, ``num_stages`` and
    ``out_indices``; families adapt loading through :meth:`converter_kwargs`, :meth:`optional_missing_prefixes`
    and :meth:`arch_description`.
    """

    @classmethod
    def convert(cls, state_dict: dict[str, torch.Tensor], out_indices: Sequence[int] = (0, 1, 2, 3),
                **options) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Pure conversion of any supported layout to this family's (``tools/convert_checkpoint.py``)."""
        return cls.converter(state_dict, out_indices=tuple(out_indices), **options)

    @classmethod
    def converter_options(cls) -> list[str]:
        """Keyword options of :attr:`converter` besides the state dict and ``out_indices``."""
        params = list(inspect.signature(cls.converter).parameters.values())[1:]
        return [p.name for p in params if p.name != 'out_indices' and p.kind is not p.VAR_KEYWORD]

    def init_weights(self) -> None:
        """Load ``init_cfg``'s checkpoint if it is ``type='Pretrained'`` (planned and checked first, then the
        family's default initialisation for the keys it lacks); otherwise the default initialisation."""
        cfg = self.init_cfg if isinstance(self.init_cfg, dict) else None
        if cfg is None or cfg.get('type') != 'Pretrained':
            self._default_init()
            super().init_weights()
            return
        ckpt_path = cfg.get('checkpoint')
        if not ckpt_path:
            raise CheckpointError("init_cfg type 'Pretrained' needs checkpoint=PATH")
        plan, dropped = self.plan_pretrained(ckpt_path, prefix=cfg.get('prefix'))  # raises before any change
        self._default_init()  # for the keys the checkpoint does not have (output norms)
        self.load_state_dict(plan.state_dict, strict=False)
        name = type(self).__name__
        print_log(f'{name}: loaded {len(plan.state_dict)} tensors from {ckpt_path}', logger='current')
        print_log(f'{name}: missing keys (newly initialised): {", ".join(plan.missing) or "none"}', logger='current')
        print_log(f'{name}: unexpected keys (ignored): {", ".join(dropped) or "none"}', logger='current')
        self._is_init = True

    def plan_pretrained(self, path, prefix: str | None = None):
        """Read, unwrap, convert and check a checkpoint without touching the model; raises CheckpointError."""
        try:
            ckpt = load_checkpoint_file(path, map_location='cpu')
        except FileNotFoundError as err:
            if '://' in str(path):  # a URL: the download error says what the server answered
                raise CheckpointError(f'pretrained checkpoint {path!r} could not be fetched: {err}. Check the URL, '
                                      'or download the file and point init_cfg.checkpoint at it') from None
            raise CheckpointError(
                f'pretrained checkpoint not found: {path!r}. Download the official weights (see docs/configuring.md, '
                '"Pretrained weights") to that path, point init_cfg.checkpoint elsewhere, or train from scratch with '
                '--cfg-options model.backbone.init_cfg=None') from None
        try:
            sd = unwrap_state_dict(ckpt, prefix=prefix)
            converted, dropped = self.convert_state_dict(sd)
            plan = plan_load(self.state_dict(), converted, optional_missing=self.optional_missing_prefixes(converted),
                             arch_hint=self.arch_description())
        except CheckpointError as err:
            raise CheckpointError(f'cannot load {path!r} into {self.public_name()}: {err}') from None
        return plan, dropped

    def convert_state_dict(self, sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Convert any supported layout to this model's; returns ``(state_dict, dropped_keys)``."""
        return self.convert(sd, out_indices=self.out_indices, **self.converter_kwargs())

    def converter_kwargs(self) -> dict:
        """Options of :attr:`converter` that depend on this model's settings (beyond ``out_indices``)."""
        return {}

    def optional_missing_prefixes(self, state_dict: dict[str, torch.Tensor] | None = None) -> tuple[str, ...]:
        """Key prefixes a checkpoint may lack (they keep their fresh initialisation): the output norms. Families
        may add more, depending on the converted ``state_dict`` about to be loaded."""
        return tuple(f'norm{i}.' for i in range(self.num_stages))

    def arch_description(self) -> str:
        return ''
