"""What every plugin backbone shares: arch tables, output indices, freezing, norm_eval and pretrained loading."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...checkpoint import CheckpointError, load_checkpoint_file
from ...converters.common import plan_load, unwrap_state_dict


class BaseBackbone(BaseModule):
    """Base class of the plugin's dense-prediction backbones.

    Subclasses define ``arch_zoo`` (name -> settings), ``arch_keys`` (required keys of a custom arch dict),
    :meth:`_frozen_modules` and :attr:`converter` (a pure ``state_dict -> (state_dict, dropped_keys)`` function).

    ``init_cfg=dict(type='Pretrained', checkpoint=PATH[, prefix='backbone.'])`` is handled here rather than by
    mmengine's ``PretrainedInit``: the file is read with weights-only semantics, unwrapped from any container,
    converted from whichever published layout it has, checked key by key against the model, and only then loaded.
    """

    arch_zoo: dict[str, dict] = {}
    arch_keys: tuple[str, ...] = ()
    num_stages = 4
    converter: Callable | None = None

    def __init__(self, init_cfg=None):
        super().__init__(init_cfg=init_cfg)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def resolve_arch(cls, arch: str | dict) -> dict:
        """Return the settings for ``arch`` (a name in ``arch_zoo``, any case, or a dict) after validation."""
        if isinstance(arch, str):
            key = arch.lower()
            if key not in cls.arch_zoo:
                raise ValueError(f'unknown arch {arch!r} for {cls.__name__}; valid: {sorted(cls.arch_zoo)} '
                                 f'or a dict with keys {list(cls.arch_keys)}')
            return dict(cls.arch_zoo[key])
        if not isinstance(arch, dict):
            raise TypeError(f'arch must be a name or a dict, got {type(arch).__name__}')
        missing = [k for k in cls.arch_keys if k not in arch]
        if missing:
            raise ValueError(f'custom arch dict for {cls.__name__} lacks {missing}; it needs {list(cls.arch_keys)}')
        for k in cls.arch_keys:
            v = arch[k]
            if isinstance(v, (list, tuple)) and len(v) != cls.num_stages:
                raise ValueError(f'arch[{k!r}] must have {cls.num_stages} entries (one per stage), got {list(v)}')
        return dict(arch)

    @classmethod
    def check_out_indices(cls, out_indices: Sequence[int]) -> tuple[int, ...]:
        if isinstance(out_indices, int):
            out_indices = (out_indices, )
        idx = tuple(int(i) % cls.num_stages if -cls.num_stages <= int(i) < 0 else int(i) for i in out_indices)
        if not idx or any(not 0 <= i < cls.num_stages for i in idx) or len(set(idx)) != len(idx):
            raise ValueError(f'out_indices must be distinct stage indices in 0..{cls.num_stages - 1}, '
                             f'got {tuple(out_indices)}')
        return idx

    @staticmethod
    def check_input(x: torch.Tensor, in_channels: int) -> None:
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f'expected an image batch of shape (N, {in_channels}, H, W), got {shape}')
        if x.shape[1] != in_channels:
            raise ValueError(f'expected {in_channels} input channels, got {x.shape[1]} (input shape '
                             f'{tuple(x.shape)}); set in_channels or check the data pipeline')

    # ------------------------------------------------------------------ freezing / norm_eval
    def _frozen_modules(self) -> list[nn.Module]:
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        for m in self._frozen_modules():
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and getattr(self, 'norm_eval', False):
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    # ------------------------------------------------------------------ pretrained weights
    def _default_init(self) -> None:
        """Random initialisation used when no checkpoint is given (and before one is loaded)."""

    def init_weights(self) -> None:
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
        self._apply_plan(plan, dropped, ckpt_path)
        self._is_init = True

    def load_pretrained(self, path, prefix: str | None = None) -> None:
        """Load an official / timm / OpenMMLab / plugin checkpoint file into this backbone (see class doc)."""
        plan, dropped = self.plan_pretrained(path, prefix)
        self._apply_plan(plan, dropped, path)

    def plan_pretrained(self, path, prefix: str | None = None):
        """Read, unwrap, convert and check a checkpoint without touching the model; raises CheckpointError."""
        try:
            ckpt = load_checkpoint_file(path, map_location='cpu')
        except FileNotFoundError:
            raise CheckpointError(
                f'pretrained checkpoint not found: {path!r}. Download the official weights (see README, "Official '
                'weights") to that path, point init_cfg.checkpoint elsewhere, or train from scratch with '
                '--cfg-options model.backbone.init_cfg=None') from None
        try:
            sd = unwrap_state_dict(ckpt, prefix=prefix)
            converted, dropped = self.convert_state_dict(sd)
            plan = plan_load(self.state_dict(), converted, optional_missing=self.optional_missing_prefixes(),
                             arch_hint=self.arch_description())
        except CheckpointError as err:
            raise CheckpointError(f'cannot load {path!r} into {type(self).__name__}: {err}') from None
        return plan, dropped

    def _apply_plan(self, plan, dropped, path) -> None:
        self.load_state_dict(plan.state_dict, strict=False)
        name = type(self).__name__
        print_log(f'{name}: loaded {len(plan.state_dict)} tensors from {path}', logger='current')
        print_log(f'{name}: missing keys (newly initialised): {", ".join(plan.missing) or "none"}', logger='current')
        print_log(f'{name}: unexpected keys (ignored): {", ".join(dropped) or "none"}', logger='current')

    def convert_state_dict(self, sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Convert any supported layout to this model's; returns ``(state_dict, dropped_keys)``."""
        assert self.converter is not None
        return type(self).converter(sd, **self.converter_kwargs())

    def converter_kwargs(self) -> dict:
        return {}

    def optional_missing_prefixes(self) -> tuple[str, ...]:
        return tuple(f'norm{i}.' for i in range(self.num_stages))

    def arch_description(self) -> str:
        return ''
