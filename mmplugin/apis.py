"""Build a detector / segmentor from its config and load a checkpoint into it, checked: what the tools share.

:func:`build_model` is the one builder of ``tools/export.py``, ``tools/export_mmdeploy.py``, ``tools/infer.py``'s fit
check, ``tools/convert_checkpoint.py --config`` and ``tools/speed_table.py``; :func:`checkpoint_fit` is the fit check
of those and of ``tools/test.py`` (on the runner's model); :func:`load_config` reads a config the way every tool
does. Whether a checkpoint fits, and loading it, is :mod:`mmplugin.loading.fit` (published layouts of the plugin's
backbones are converted first), on the part of the model that is used; :func:`checkpoint_fit`,
:func:`load_checkpoint_checked` and :data:`PART_CHILDREN` are re-exported here as the tools' one entry point.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Mapping

import torch
from torch import nn

from mmplugin.loading.fit import PART_CHILDREN, checkpoint_fit, load_checkpoint_checked
from mmplugin.models.wiring import PYRAMID_NECKS, _first_neck, backbone_out_channels
from mmplugin.utils.errors import ConfigWiringError, PartError

__all__ = ['PartError', 'PART_CHILDREN', 'load_config', 'build_model', 'checkpoint_fit',
           'load_checkpoint_checked', 'ConfigWiringError', 'PYRAMID_NECKS', 'check_model_wiring']

def load_config(cfg, cfg_options: Mapping | None = None):
    """``cfg`` (a path or an mmengine ``Config``) with ``cfg_options`` (``--cfg-options key=value``) merged in.

    A Config is copied first, so the caller's stays as it was.

    Raises:
        FileNotFoundError: no such config file.
    """
    from mmengine.config import Config

    from mmplugin.cli.common import check_cfg_option_keys, nearest_config
    if isinstance(cfg, (str, os.PathLike)):
        if not os.path.isfile(cfg):
            raise FileNotFoundError(f'config file not found: {cfg}{nearest_config(str(cfg))}')
        cfg = Config.fromfile(cfg)
    else:
        cfg = copy.deepcopy(cfg)
    if cfg_options:
        from mmplugin.cli.common import CfgOptionError
        try:
            cfg.merge_from_dict(check_cfg_option_keys(cfg, dict(cfg_options)))
        except TypeError as err:  # e.g. a dict merged into a key the config holds as None
            raise CfgOptionError(f'--cfg-options: {err}') from None
    return cfg


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
    try:
        got = backbone_out_channels(backbone_cfg, MODELS)  # built on the meta device and run once
        if index is not None:
            got = [got[i] for i in index] if isinstance(index, (list, tuple)) else got[index]
    except (ConfigWiringError, IndexError, TypeError):  # not runnable on meta, odd indices: mmdet / mmseg check later
        return
    want_list = [int(c) for c in want] if isinstance(want, (list, tuple)) else int(want)
    if want_list != got:
        indices = backbone_cfg.get('out_indices')
        raise ConfigWiringError(
            f'{name}: {who} is {want_list} but the backbone ({backbone_cfg.get("type")}'
            + (f', out_indices={tuple(indices)}' if indices is not None else '')
            + f') gives {got}; set {who.split(" (")[0]}.in_channels={got}'
            + (' or change the backbone\'s out_indices' if indices is not None else ''))
