"""What every plugin backbone shares: the template a backbone family fills in.

A *family* is one backbone class (``SwiftFormer``, ``SwinTransformer``, ``SwinTransformerV2``, ...). It declares,
in its own file and nowhere else:

* ``family``: its name (``'swiftformer'``), which also registers it in :data:`FAMILIES` (:mod:`.registry`);
* ``arch_zoo`` / ``arch_keys``: named settings and the keys a custom arch dict must have;
* ``converter``: a pure ``(state_dict, **options) -> (state_dict, dropped_keys)`` function from any published
  layout to the family's own, and :meth:`detect`, which recognises the family's checkpoints (and no other's);
* :meth:`layer_depth`: the depth index of a parameter, for layer-wise learning-rate decay;
* the few hooks of the forward skeleton below (:meth:`forward_stem`, :meth:`forward_stage`, :meth:`stem_modules`,
  :meth:`stage_modules`).

:class:`BaseBackbone` owns everything else: argument checks, out_indices / out_channels / out_strides
bookkeeping, per-output norms, freezing, ``norm_eval``, gradient checkpointing (``with_cp`` or
:meth:`set_grad_checkpointing`, also after construction), empty batches, and pretrained loading (the
:class:`~.pretrained.PretrainedMixin`).

Contract checked for every family by ``tests/models/backbones/test_conformance.py``: output ``k`` is an NCHW tensor with
``out_channels[k]`` channels and spatial size ``ceil(H / out_strides[k]) x ceil(W / out_strides[k])``.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmplugin.models.backbones.arguments import check_int_list
from mmplugin.models.backbones.pretrained import PretrainedMixin, resolve_pretrained
from mmplugin.models.backbones.registry import FAMILIES, detect_family, get_family, register_family
from mmplugin.models.layers.layout import contiguous_nchw
from mmplugin.models.layers.precision import autocast_dtype
from mmplugin.utils.errors import ConfigTypeError, ConfigValueError

__all__ = ['BaseBackbone', 'FAMILIES', 'detect_family', 'get_family', 'check_int_list']


class BaseBackbone(PretrainedMixin, BaseModule):
    """Base class of the plugin's dense-prediction backbones (see the module docstring for what a family adds).

    Args:
        in_channels (int): image channels.
        out_indices (Sequence[int]): stages to return (0 = stride 4 ... 3 = stride 32). Returned in ascending stage
            order whatever the order given, as mmdet does; ``out_channels`` / ``out_strides`` follow that order.
        frozen_stages (int): -1 none; 0 the stem; ``i`` the stem and stages 1..i (with their output norms).
            Applied at construction (so DDP never sees trainable frozen weights) and kept through ``train()``.
        norm_eval (bool): keep every BatchNorm in eval mode while training.
        with_cp (bool): gradient checkpointing per block (also settable later with
            :meth:`set_grad_checkpointing`).
        drop_path_rate (float): stochastic depth rate in [0, 1).
        init_cfg (dict | None): ``dict(type='Pretrained', checkpoint=PATH[, prefix='backbone.'])`` is handled
            here rather than by mmengine's ``PretrainedInit``: the file is read with weights-only semantics,
            unwrapped from any container, converted from whichever published layout it has, checked key by key
            against the model, and only then loaded.
        pretrained (str | None): deprecated OpenMMLab spelling of ``init_cfg`` (a path or URL); ResNet model-zoo
            aliases inherited from a base config's ``model.pretrained`` are ignored with a warning.
    """

    family: str | None = None
    arch_zoo: dict[str, dict] = {}
    arch_keys: tuple[str, ...] = ()
    #: a few-thousand-parameter arch of the family for quick checks (tests, smoke runs); None: the first arch
    smoke_arch: dict | None = None
    #: stages of the network; a family whose arch decides it (Swin: ``len(depths)``) sets ``self.num_stages``
    #: before calling ``BaseBackbone.__init__``
    num_stages = 4
    converter: Callable | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        register_family(cls)

    def __init__(self, in_channels: int = 3, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, drop_path_rate: float = 0.0, init_cfg=None,
                 pretrained: str | None = None):
        name = self.public_name()
        super().__init__(init_cfg=resolve_pretrained(name, pretrained, init_cfg))
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ConfigValueError(f'{name}: in_channels must be a positive int, got {in_channels!r}')
        if isinstance(frozen_stages, bool) or not isinstance(frozen_stages, int) \
                or not -1 <= frozen_stages <= self.num_stages:
            raise ConfigValueError(f'{name}: frozen_stages must be an int in -1..{self.num_stages}, '
                                   f'got {frozen_stages!r}')
        if isinstance(drop_path_rate, bool) or not isinstance(drop_path_rate, (int, float)) \
                or not 0.0 <= drop_path_rate < 1.0:
            raise ConfigValueError(f'{name}: drop_path_rate must be a number in [0, 1), got {drop_path_rate!r}')
        self.in_channels = in_channels
        self.out_indices = self.check_out_indices(out_indices, self.num_stages)
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, bool(norm_eval), bool(with_cp)
        self.drop_path_rate = float(drop_path_rate)

    # ------------------------------------------------------------------ family declaration
    @classmethod
    def public_name(cls) -> str:
        return f'mmplugin.{cls.__name__}'

    @classmethod
    def detect(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        """Whether ``state_dict`` (unwrapped, any published layout) holds this family's weights."""
        raise NotImplementedError

    @classmethod
    def arch_names(cls) -> list[str]:
        """Canonical arch names: one per distinct entry of ``arch_zoo`` (the last alias, e.g. ``'tiny'``)."""
        seen: dict[int, str] = {}
        for name, settings in cls.arch_zoo.items():
            seen[id(settings)] = name
        return list(seen.values())

    @classmethod
    def smallest_arch(cls) -> str | dict:
        """:attr:`smoke_arch` if declared, else the first named arch."""
        return dict(cls.smoke_arch) if cls.smoke_arch else cls.arch_names()[0]

    @classmethod
    def default_arch(cls) -> str:
        """The arch used when a tool is not told one: the family's constructor default."""
        default = inspect.signature(cls.__init__).parameters.get('arch')
        if default is not None and isinstance(default.default, str):
            return str(default.default)
        return cls.arch_names()[0]

    def layer_depth(self, name: str) -> int:
        """Depth index of parameter ``name`` (relative to the backbone) for layer-wise lr decay: 0 for the stem,
        up to :attr:`num_layers` - 1. Families that support layer decay override this."""
        raise NotImplementedError(f'{self.public_name()} does not define layer depths; layer-wise lr decay is '
                                  'not available for it')

    @property
    def num_layers(self) -> int:
        """Number of depth indices of :meth:`layer_depth`; parameters outside the backbone get this value."""
        raise NotImplementedError(f'{self.public_name()} does not define layer depths')

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def resolve_arch(cls, arch: str | dict) -> dict:
        """Return the settings for ``arch`` (a name in ``arch_zoo``, any case, or a dict) after validation."""
        name = cls.public_name()
        if isinstance(arch, str):
            key = arch.lower()
            if key not in cls.arch_zoo:
                raise ConfigValueError(f'{name}: unknown arch {arch!r}; valid: {sorted(cls.arch_zoo)} '
                                 f'or a dict with keys {list(cls.arch_keys)}')
            return dict(cls.arch_zoo[key])
        if not isinstance(arch, dict):
            raise ConfigTypeError(f'{name}: arch must be a name or a dict, got {type(arch).__name__}')
        missing = [k for k in cls.arch_keys if k not in arch]
        unknown = [k for k in arch if k not in cls.arch_keys]
        if missing or unknown:
            raise ConfigValueError(f'{name}: a custom arch dict needs exactly the keys {list(cls.arch_keys)}; '
                             + (f'missing {missing}' if missing else '') + ('; ' if missing and unknown else '')
                             + (f'unknown {unknown}' if unknown else ''))
        return dict(arch)

    @classmethod
    def check_out_indices(cls, out_indices: Sequence[int], num_stages: int | None = None) -> tuple[int, ...]:
        """Validated, ascending stage indices (negative ones count from the end) of a model with ``num_stages``
        stages (default: the class's :attr:`num_stages`)."""
        n = cls.num_stages if num_stages is None else num_stages
        if isinstance(out_indices, int) and not isinstance(out_indices, bool):
            out_indices = (out_indices, )
        msg = f'{cls.public_name()}: out_indices must be distinct stage indices in 0..{n - 1}, got {out_indices!r}'
        if not isinstance(out_indices, Sequence) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in out_indices):
            raise TypeError(msg)
        idx = [i + n if -n <= i < 0 else i for i in out_indices]
        if not idx or any(not 0 <= i < n for i in idx) or len(set(idx)) != len(idx):
            raise ValueError(msg)
        return tuple(sorted(idx))

    def _declare_stages(self, channels: Sequence[int], strides: Sequence[int]) -> None:
        """Record every stage's width and stride; ``out_channels`` / ``out_strides`` follow ``out_indices``."""
        self.stage_channels, self.stage_strides = [int(c) for c in channels], [int(s) for s in strides]
        self.out_channels = [self.stage_channels[i] for i in self.out_indices]
        self.out_strides = [self.stage_strides[i] for i in self.out_indices]

    def _add_out_norms(self, make_norm: Callable[[int], nn.Module]) -> None:
        """One norm ``norm{i}`` per returned stage (``make_norm(channels)``)."""
        for i in self.out_indices:
            self.add_module(f'norm{i}', make_norm(self.stage_channels[i]))

    def _finish_init(self) -> None:
        """Call at the end of a family's ``__init__``: default initialisation, then freezing."""
        self._default_init()
        self._freeze_stages()

    def output_shape(self) -> list[dict]:
        """One ``dict(index, channels, stride)`` per output, in output order (cf. detectron2 ``output_shape()``,
        timm ``feature_info``)."""
        return [dict(index=i, channels=c, stride=s)
                for i, c, s in zip(self.out_indices, self.out_channels, self.out_strides)]

    def check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ConfigValueError(f'{self.public_name()}: expected an image batch of shape '
                                   f'(N, {self.in_channels}, H, W), got {shape}')
        if x.shape[1] != self.in_channels:
            raise ConfigValueError(f'{self.public_name()}: expected {self.in_channels} input channels, '
                                   f'got {x.shape[1]} (input shape {tuple(x.shape)}); set in_channels or check the '
                                   'data pipeline')
        if x.shape[2] < 1 or x.shape[3] < 1:
            raise ConfigValueError(f'{self.public_name()}: empty image size {tuple(x.shape[2:])}')
        if not x.is_floating_point():
            raise ConfigTypeError(f'{self.public_name()}: expected a floating-point image batch, got {x.dtype}; '
                            'convert it with .float() (and normalise it as the data preprocessor does)')
        param = next(self.parameters(), None)
        if param is not None and x.dtype != param.dtype and not (
                autocast_dtype(x.device.type) is not None
                and x.dtype in (torch.float32, torch.bfloat16, torch.float16)):
            raise ConfigTypeError(f'{self.public_name()}: input dtype {x.dtype} does not match the model\'s '
                                  f'parameter dtype {param.dtype}; convert the input (x.to({param.dtype})) or the '
                                  'model, or run under torch.autocast for mixed precision')

    # ------------------------------------------------------------------ forward skeleton
    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, in_channels, H, W)`` -> the first stage's input (layout chosen by the family)."""
        raise NotImplementedError

    def forward_stage(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run stage ``i`` on ``x``; returns ``(feature of stage i, input of stage i + 1)``. Blocks should be
        called through :meth:`run_block` so that gradient checkpointing applies."""
        raise NotImplementedError

    def forward_output(self, i: int, feat: torch.Tensor) -> torch.Tensor:
        """Stage ``i``'s feature -> returned NCHW map: output norm, then contiguous NCHW memory (mmcv's CPU/CUDA
        ops such as RoIAlign read raw NCHW memory)."""
        return contiguous_nchw(getattr(self, f'norm{i}')(feat))

    def run_block(self, block: nn.Module, x: torch.Tensor, *args) -> torch.Tensor:
        """``block(x, *args)``, recomputed in the backward pass when gradient checkpointing is on."""
        if self.with_cp and self.training and x.requires_grad:
            return cp.checkpoint(block, x, *args, use_reentrant=False)
        return block(x, *args)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Turn per-block gradient checkpointing on or off (same as ``with_cp``)."""
        self.with_cp = bool(enable)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Args: x: ``(N, in_channels, H, W)``. Returns one ``(N, out_channels[k], ceil(H / out_strides[k]),
        ceil(W / out_strides[k]))`` map per output index, in ascending stage order."""
        self.check_input(x)
        n, _, h, w = x.shape
        if n == 0:  # nothing to compute; shapes follow the contract
            return tuple(x.new_zeros(0, c, math.ceil(h / s), math.ceil(w / s))
                         for c, s in zip(self.out_channels, self.out_strides))
        x = self.forward_stem(x)
        outs = []
        for i in range(self.num_stages):
            feat, x = self.forward_stage(i, x)
            if i in self.out_indices:
                outs.append(self.forward_output(i, feat))
        return tuple(outs)

    # ------------------------------------------------------------------ freezing / norm_eval
    def stem_modules(self) -> list[nn.Module]:
        """Modules frozen by ``frozen_stages >= 0``."""
        raise NotImplementedError

    def stage_modules(self, i: int) -> list[nn.Module]:
        """Modules of stage ``i`` (0-based) frozen by ``frozen_stages >= i + 1``."""
        raise NotImplementedError

    def _frozen_modules(self) -> list[nn.Module]:
        mods: list[nn.Module] = []
        if self.frozen_stages >= 0:
            mods += self.stem_modules()
        for i in range(min(self.frozen_stages, self.num_stages)):
            mods += self.stage_modules(i)
            if i in self.out_indices:
                mods.append(getattr(self, f'norm{i}'))
        return mods

    def _freeze_stages(self) -> None:
        for m in self._frozen_modules():
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    # ------------------------------------------------------------------ initialisation
    def _default_init(self) -> None:
        """Random initialisation used when no checkpoint is given (and before one is loaded)."""
