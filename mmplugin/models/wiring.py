"""Necks and heads wired from the backbone: ``in_channels`` left to the backbone instead of guessed.

Putting a backbone under another detector or segmentor means copying its output channels into the neck (mmdet's
FPN, ChannelMapper, CSPNeXtPAFPN ...) or, without a neck, into the heads that read the backbone (mmseg's decode
and auxiliary heads, mmdet's Mask2Former head); a wrong list ends in an ``AssertionError`` or in "expected input ...
to have 576 channels". Here a config may leave those ``in_channels`` out, or write :data:`FROM_BACKBONE`::

    model = dict(
        backbone=dict(type='mmplugin.SwiftFormer', arch='l1', out_indices=(1, 2, 3)),
        neck=dict(type='ChannelMapper', in_channels=FROM_BACKBONE, ...),   # or no in_channels at all
        ...)

and the channels are read off the backbone itself: it is built on the ``meta`` device (no memory, no weights) and
run on a 64 x 64 image, so any backbone works, the plugin's or mmdet's / mmseg's own, with any ``out_indices``.
What is filled in:

* the (first) neck's ``in_channels``: the list of every output, when it is :data:`FROM_BACKBONE`, or absent for a
  neck that reads every level in order (:data:`PYRAMID_NECKS`);
* with no neck, ``in_channels`` of ``decode_head`` / ``auxiliary_head`` (each head of a list) and of mmdet's
  ``panoptic_head``: the outputs at the head's ``in_index`` (an int gives one channel count, a list a list; no
  ``in_index``: every output).

:func:`install_channel_wiring` (called on ``import mmplugin``, so also through ``custom_imports``) applies this to
every model built from a config: the plugin's tools, mmdet's ``init_detector``, mmseg's ``init_model`` and
mmengine's ``Runner``. Explicit channel lists are never changed (:func:`mmplugin.apis.check_model_wiring` checks
them).
"""
from __future__ import annotations

import copy
from collections.abc import Mapping

import torch

from mmplugin.utils.errors import ConfigWiringError

__all__ = ['FROM_BACKBONE', 'PYRAMID_NECKS', 'needs_wiring', 'backbone_out_channels', 'wire_channels',
           'install_channel_wiring']

#: the marker a config writes for "the backbone's channels"
FROM_BACKBONE = 'from_backbone'

#: necks that read every backbone level in order: their in_channels list is the backbone's out_channels
PYRAMID_NECKS = frozenset({'FPN', 'PAFPN', 'ChannelMapper', 'MultiLevelNeck', 'NASFPN', 'NASFCOS_FPN', 'HRFPN', 'RFP',
                           'FPN_CARAFE', 'CSPNeXtPAFPN', 'YOLOXPAFPN', 'GlobalAttentionNeck', 'SSDNeck'})

_HEADS = ('decode_head', 'auxiliary_head', 'panoptic_head')
_INSTALLED = False


def _kind(cfg: Mapping) -> str:
    t = cfg.get('type', '')
    return (t if isinstance(t, str) else getattr(t, '__name__', '')).split('.')[-1]


def _first_neck(model_cfg: Mapping) -> Mapping | None:
    neck = model_cfg.get('neck')
    if isinstance(neck, (list, tuple)):
        neck = neck[0] if neck else None
    return neck if isinstance(neck, Mapping) else None


def _heads(model_cfg: Mapping) -> list[tuple[str, Mapping]]:
    out = []
    for key in _HEADS:
        head = model_cfg.get(key)
        for i, h in enumerate(head if isinstance(head, (list, tuple)) else [head]):
            if isinstance(h, Mapping):
                out.append((f'{key}.{i}' if isinstance(head, (list, tuple)) else key, h))
    return out


def _wanted(cfg: Mapping, missing_counts: bool) -> bool:
    value = cfg.get('in_channels', None)
    return value == FROM_BACKBONE or ('in_channels' not in cfg and missing_counts)


def needs_wiring(model_cfg: Mapping) -> bool:
    """Whether the model config leaves any ``in_channels`` to its backbone (see the module docstring)."""
    if not isinstance(model_cfg, Mapping) or not isinstance(model_cfg.get('backbone'), Mapping):
        return False
    neck = _first_neck(model_cfg)
    if neck is not None:
        return _wanted(neck, _kind(neck) in PYRAMID_NECKS) or any(h.get('in_channels') == FROM_BACKBONE
                                                                   for _, h in _heads(model_cfg))
    return any(_wanted(h, True) for _, h in _heads(model_cfg))


def backbone_out_channels(backbone_cfg: Mapping, registry) -> list[int]:
    """The channel count of every output of the backbone ``backbone_cfg``, built with ``registry`` on the ``meta``
    device (no weights are read: ``init_cfg`` and ``pretrained`` are dropped) and run on a 64 x 64 image.

    Raises:
        ConfigWiringError: the backbone cannot be built or run that way; the message says to set the channels.
    """
    cfg = copy.deepcopy(dict(backbone_cfg))
    cfg.pop('init_cfg', None)
    cfg.pop('pretrained', None)
    try:
        with torch.device('meta'):
            backbone = registry.build(cfg).eval()
            outs = backbone(torch.empty(1, int(cfg.get('in_channels', 3)), 64, 64))
    except ConfigWiringError:
        raise
    except Exception as err:  # noqa: BLE001  (compiled ops, odd outputs: the user sets the channels)
        raise ConfigWiringError(f'in_channels were left to the backbone ({cfg.get("type")}), which could not be '
                                f'run on the meta device to read them ({type(err).__name__}: {err}); set them in '
                                'the config') from None
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    return [int(o.shape[1]) for o in outs]


def _at(channels: list[int], index, where: str):
    if index is None:
        return list(channels)
    try:
        return [channels[i] for i in index] if isinstance(index, (list, tuple)) else channels[index]
    except (IndexError, TypeError):
        raise ConfigWiringError(f'{where}.in_index={index!r} but the backbone gives {len(channels)} outputs '
                                f'(channels {channels})') from None


def wire_channels(model_cfg: Mapping, registry) -> Mapping:
    """A copy of the model config with every ``in_channels`` left to the backbone filled in (``model_cfg`` itself
    when none is). ``registry`` builds the backbone (the registry the model is built with)."""
    if not needs_wiring(model_cfg):
        return model_cfg
    cfg = copy.deepcopy(model_cfg)
    channels = backbone_out_channels(cfg['backbone'], registry)
    neck = _first_neck(cfg)
    if neck is not None:
        if _wanted(neck, _kind(neck) in PYRAMID_NECKS):
            neck['in_channels'] = list(channels)
        for where, head in _heads(cfg):
            if head.get('in_channels') == FROM_BACKBONE:
                raise ConfigWiringError(f'model.{where}.in_channels={FROM_BACKBONE!r}, but the model has a neck: '
                                        'the head reads the neck, whose out_channels it must be given')
        return cfg
    for where, head in _heads(cfg):
        if _wanted(head, True):
            head['in_channels'] = _at(channels, head.get('in_index'), f'model.{where}')
    return cfg


def install_channel_wiring() -> None:
    """Fill in ``in_channels`` left to the backbone whenever an mmengine registry named ``model`` builds a config
    with a ``backbone`` (mmdet's / mmseg's detectors and segmentors, wrappers such as TTA models). Idempotent."""
    global _INSTALLED
    if _INSTALLED:
        return
    from mmengine.registry import Registry

    original = Registry.build

    def build(self, cfg, *args, **kwargs):
        if self.name == 'model' and isinstance(cfg, Mapping) and 'backbone' in cfg and needs_wiring(cfg):
            cfg = wire_channels(cfg, self)
        return original(self, cfg, *args, **kwargs)

    build.__wrapped__ = original
    Registry.build = build
    _INSTALLED = True
