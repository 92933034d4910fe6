"""Build a detector / segmentor from its config and load a checkpoint into it, checked: what the tools share.

:func:`build_model` is the one builder of ``tools/export.py``, ``tools/export_mmdeploy.py``, ``tools/infer.py``'s fit
check, ``tools/convert_checkpoint.py --config`` and ``tools/speed_table.py``; :func:`checkpoint_fit` is the fit check
of those and of ``tools/test.py`` (on the runner's model); :func:`load_config` reads a config the way every tool
does. Whether a checkpoint fits is decided by :func:`mmplugin.checkpoint.check_checkpoint_fits` (published layouts of
the plugin's backbones are converted first), on the part of the model that is used: exporting the backbone of a
detector needs the backbone's weights only, so a backbone-only file (e.g. converted ImageNet weights) is enough
there, and refused where the neck is exported too.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .utils.errors import ConfigWiringError, PartError

__all__ = ['PartError', 'PART_CHILDREN', 'load_config', 'build_model', 'checkpoint_fit',
           'load_checkpoint_checked', 'ConfigWiringError', 'PYRAMID_NECKS', 'check_model_wiring']

# the model's top-level children each part runs; None: the whole model
PART_CHILDREN: dict[str, tuple[str, ...] | None] = {
    'backbone': ('backbone', ),
    'backbone+neck': ('backbone', 'neck'),
    'model': None,
}


def load_config(cfg, cfg_options: Mapping | None = None):
    """``cfg`` (a path or an mmengine ``Config``) with ``cfg_options`` (``--cfg-options key=value``) merged in.

    A Config is copied first, so the caller's stays as it was.

    Raises:
        FileNotFoundError: no such config file.
    """
    from mmengine.config import Config

    from .utils.cli import check_cfg_option_keys, nearest_config
    if isinstance(cfg, (str, os.PathLike)):
        if not os.path.isfile(cfg):
            raise FileNotFoundError(f'config file not found: {cfg}{nearest_config(str(cfg))}')
        cfg = Config.fromfile(cfg)
    else:
        cfg = copy.deepcopy(cfg)
    if cfg_options:
        from .utils.cli import CfgOptionError
        try:
            cfg.merge_from_dict(check_cfg_option_keys(cfg, dict(cfg_options)))
        except TypeError as err:  # e.g. a dict merged into a key the config holds as None
            raise CfgOptionError(f'--cfg-options: {err}') from None
    return cfg


class _Part(nn.Module):
    """The children of ``model`` that ``names`` lists, under their own names (their ``state_dict`` keys are the
    whole model's keys of that part)."""

    def __init__(self, model: nn.Module, names: Sequence[str]):
        super().__init__()
        for name in names:
            child = getattr(model, name, None)
            if not isinstance(child, nn.Module):
                raise PartError(f'{type(model).__name__} has no {name}: choose a part it has')
            self.add_module(name, child)


def _part_checkpoint(ckpt: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors of the part made of the children ``names`` (keys ``backbone.*``, ``neck.*``, ...).

    A file without any ``backbone.`` key is a backbone-only file (an ImageNet classifier, a converted backbone):
    its keys are the backbone's, so they get the ``backbone.`` prefix; the other children then find nothing.
    """
    from .converters.common import unwrap_state_dict
    sd = ckpt.get('state_dict', ckpt) if isinstance(ckpt, Mapping) else None
    if isinstance(sd, Mapping):
        sd = {k[len('module.'):] if str(k).startswith('module.') else str(k): v for k, v in sd.items()}
    if isinstance(sd, Mapping) and any(k.startswith('backbone.') for k in sd):
        return {k: v for k, v in sd.items() if k.split('.', 1)[0] in names}
    backbone = unwrap_state_dict(ckpt)  # CheckpointError when the file holds no tensors
    return {f'backbone.{k}': v for k, v in backbone.items()}


def _part_and_checkpoint(model: nn.Module, ckpt: Any, part: str | None) -> tuple[nn.Module, Any]:
    """The module holding the ``part`` in use and the checkpoint restricted to that part (the whole model and the
    checkpoint as they are for ``part=None``)."""
    while hasattr(model, 'module') and isinstance(model.module, nn.Module):
        model = model.module
    if part is not None and part not in PART_CHILDREN:
        raise PartError(f'part must be one of {tuple(PART_CHILDREN)}, got {part!r}')
    names = PART_CHILDREN.get(part) if part is not None else None
    if names is None:
        return model, ckpt
    return _Part(model, names), {'state_dict': _part_checkpoint(ckpt, names)}


def checkpoint_fit(model: nn.Module, ckpt: Any, *, part: str | None = None, source: str = 'the checkpoint',
                   model_name: str = 'the model') -> str | None:
    """Whether the loaded checkpoint ``ckpt`` fits the ``part`` of ``model`` that is used (nothing is loaded).

    Args:
        model: the detector / segmentor (wrappers are unwrapped).
        ckpt: a checkpoint loaded with :func:`mmplugin.checkpoint.load_checkpoint_file`.
        part: a key of :data:`PART_CHILDREN`; only that part's keys are compared (None: the whole model).
        source, model_name: how the message names the file and the model (e.g. the config).

    Returns:
        None when it fits, else the message of :func:`mmplugin.checkpoint.check_checkpoint_fits`.
    """
    from .checkpoint import check_checkpoint_fits
    target, used = _part_and_checkpoint(model, ckpt, part)
    what = model_name if part in (None, 'model') else f'the {part} of {model_name}'
    return check_checkpoint_fits(target, used, source=source, model_name=what)


def load_checkpoint_checked(model: nn.Module, checkpoint: str | Mapping, *, part: str | None = None,
                            strict: bool = True, source: str | None = None,
                            model_name: str = 'the model') -> str | None:
    """Load ``checkpoint`` (weights-only) into ``model`` after checking that it fits the ``part`` that is used
    (:func:`checkpoint_fit`); published layouts of the plugin's backbones are converted as they load.

    Args:
        model: the detector / segmentor (wrappers are unwrapped).
        checkpoint: a path or http(s) URL, or a checkpoint already loaded with
            :func:`mmplugin.checkpoint.load_checkpoint_file`.
        part: a key of :data:`PART_CHILDREN`; only that part's keys are compared and loaded (None: the whole model).
        strict: a checkpoint that does not fit raises; otherwise it is loaded as far as it fits and the problem
            returned (missing weights stay as they are).
        source, model_name: how messages name the file (default: the path) and the model (e.g. the config).

    Returns:
        None when it fits, else the message of :func:`checkpoint_fit` (``strict=False``).

    Raises:
        CheckpointError: the file cannot be read safely, holds no state dict, or does not fit (``strict``).
    """
    from .checkpoint import CheckpointError, load_checkpoint_file
    from .converters.whole_model import convert_model_state_dict
    loaded = isinstance(checkpoint, Mapping)
    ckpt = checkpoint if loaded else load_checkpoint_file(checkpoint)
    source = source or ('the checkpoint' if loaded else str(checkpoint))
    problem = checkpoint_fit(model, ckpt, part=part, source=source, model_name=model_name)
    if problem and strict:
        raise CheckpointError(problem)
    target, used = _part_and_checkpoint(model, ckpt, part)
    sd = used.get('state_dict', used) if isinstance(used, Mapping) else None
    if not isinstance(sd, Mapping):
        raise CheckpointError(problem or f'{source} holds no state dict')
    sd = {k[len('module.'):] if str(k).startswith('module.') else str(k): v for k, v in sd.items()}
    own = target.state_dict()
    converted = convert_model_state_dict(target, sd).state_dict
    target.load_state_dict({k: v for k, v in converted.items()
                            if k in own and getattr(v, 'shape', None) == own[k].shape}, strict=False)
    return problem


def build_model(cfg, checkpoint: str | None = None, *, strict: bool = True, part: str | None = None,
                cfg_options: Mapping | None = None, device: str | torch.device = 'cpu', announce_random: bool = False,
                model_name: str | None = None) -> nn.Module:
    """``cfg.model`` built in its own scope (mmdet / mmseg), in eval mode and float32, with checked weights.

    Args:
        cfg: a config file or an mmengine ``Config`` (not modified).
        checkpoint: trained weights (path or http(s) URL, weights-only); None keeps the random initialisation (the
            backbone's ``init_cfg`` and the model's ``pretrained`` are dropped either way: nothing is downloaded).
        strict: refuse a checkpoint that does not fit the part in use (:func:`load_checkpoint_checked`); False
            loads what fits and warns on stderr.
        part: ``'backbone' | 'backbone+neck' | 'model'`` (None: the whole model): what is checked and loaded.
        cfg_options: ``--cfg-options`` overrides.
        device: where the model is put.
        announce_random: print a note when no checkpoint is given (the export tools).
        model_name: how messages name the model (default: the config file, or 'the model').

    Raises:
        CheckpointError: see :func:`load_checkpoint_checked`; KeyError / TypeError / ValueError from the registry
            and the modules' argument checks (an unknown type, arch or keyword).
    """
    import sys

    from mmengine.registry import MODELS, init_default_scope

    import mmplugin  # noqa: F401  (registers the plugin's modules and its safe checkpoint loading)
    name = model_name or (str(cfg) if isinstance(cfg, (str, os.PathLike)) else 'the model')
    cfg = load_config(cfg, cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    if isinstance(cfg.model.get('backbone'), Mapping):
        cfg.model.backbone.pop('init_cfg', None)  # weights come from the checkpoint (or stay random)
    cfg.model.pop('pretrained', None)
    model = MODELS.build(cfg.model)
    if checkpoint:
        problem = load_checkpoint_checked(model, checkpoint, part=part, strict=strict, model_name=name)
        if problem:
            print(f'warning: {problem}', file=sys.stderr)
    elif announce_random:
        print('note: no CHECKPOINT given: random weights (export and parity are still checked)')
    return model.eval().to(device=device, dtype=torch.float32)


# necks that read every backbone level in order: their in_channels list must equal the backbone's out_channels
PYRAMID_NECKS = frozenset({'FPN', 'PAFPN', 'ChannelMapper', 'MultiLevelNeck', 'NASFPN', 'NASFCOS_FPN', 'HRFPN', 'RFP',
                           'FPN_CARAFE', 'CSPNeXtPAFPN', 'YOLOXPAFPN', 'GlobalAttentionNeck', 'SSDNeck'})


def _first_neck(model_cfg):
    neck = model_cfg.get('neck')
    if isinstance(neck, (list, tuple)):
        neck = neck[0] if neck else None
    return neck if isinstance(neck, Mapping) else None


def check_model_wiring(cfg, name: str = 'the config') -> None:
    """Refuse a neck whose ``in_channels`` do not match what the backbone returns (count or values), before any
    model is built or data read: mmdet's FPN stops on a bare ``AssertionError`` for a wrong count and a convolution
    on "expected input ... to have 96 channels" for wrong values, and a test run blames the checkpoint.

    The backbone is built on the ``meta`` device (no memory, no weights) and run on a 64x64 image for its output
    channels. Only necks that read every level in order (:data:`PYRAMID_NECKS`: FPN, PAFPN, ChannelMapper ...)
    are checked; segmentors without a neck: the decode head's ``in_channels`` at its explicit ``in_index``. A
    backbone that cannot run on ``meta`` (compiled ops) is not checked.

    Raises:
        ConfigWiringError: one line naming both lists and the fix.
    """
    from mmengine.registry import MODELS, init_default_scope

    cfg = load_config(cfg)
    model_cfg = cfg.get('model') or {}
    backbone_cfg = model_cfg.get('backbone')
    if not isinstance(backbone_cfg, Mapping):
        return
    neck, head = _first_neck(model_cfg), model_cfg.get('decode_head')
    if neck is not None:
        kind = str(neck.get('type', '')).split('.')[-1]
        if kind not in PYRAMID_NECKS or not isinstance(neck.get('in_channels'), (list, tuple)):
            return  # a neck of another kind may legitimately reorder or pick the levels it reads
        want, who, index = neck['in_channels'], f"model.neck ({neck.get('type')}) in_channels", None
    elif isinstance(head, Mapping) and 'in_channels' in head and 'in_index' in head:
        want, who, index = head['in_channels'], f"model.decode_head ({head.get('type')}) in_channels", head['in_index']
    else:
        return
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    backbone_cfg = copy.deepcopy(dict(backbone_cfg))
    backbone_cfg.pop('init_cfg', None)
    backbone_cfg.pop('pretrained', None)
    try:
        with torch.device('meta'):
            backbone = MODELS.build(backbone_cfg).eval()
            outs = backbone(torch.empty(1, backbone_cfg.get('in_channels', 3), 64, 64))
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        got = [int(o.shape[1]) for o in outs]
        if index is not None:
            got = [got[i] for i in index] if isinstance(index, (list, tuple)) else got[index]
    except Exception:  # noqa: BLE001  (a backbone that does not run on meta, odd outputs: mmdet / mmseg check later)
        return
    want_list = [int(c) for c in want] if isinstance(want, (list, tuple)) else int(want)
    if want_list != got:
        indices = backbone_cfg.get('out_indices')
        raise ConfigWiringError(
            f'{name}: {who} is {want_list} but the backbone ({backbone_cfg.get("type")}'
            + (f', out_indices={tuple(indices)}' if indices is not None else '')
            + f') gives {got}; set {who.split(" (")[0]}.in_channels={got}'
            + (' or change the backbone\'s out_indices' if indices is not None else ''))
