"""Published whole-model layouts converted whenever mmengine loads a checkpoint into a model.

:func:`install_converting_loader` (called on ``import mmplugin``) wraps mmengine's ``_load_checkpoint_to_model``,
the function behind ``load_from``, ``--resume``, ``load_checkpoint``, mmdet's ``init_detector`` and mmseg's
``init_model``: the backbone part of an official Swin detection / segmentation checkpoint or an mmdet / mmseg zoo
file is converted to the layout of the plugin backbones in the model being loaded
(:func:`mmplugin.loading.whole_model.convert_model_state_dict`), with one log line saying what was converted.
Checkpoints that already fit, and models without plugin backbones, pass through untouched. Reading the file stays
with :mod:`mmplugin.checkpoint` (weights only).
"""
from __future__ import annotations

import re
import sys
from collections import OrderedDict
from collections.abc import Mapping

from mmplugin.loading.whole_model import convert_model_state_dict

__all__ = ['install_converting_loader']

_INSTALLED = False


def _converting_loader(original):
    """Wrap mmengine's ``_load_checkpoint_to_model`` (behind ``load_from``, ``--resume``, ``load_checkpoint``,
    mmdet's ``init_detector``, mmseg's ``init_model``) so that published whole-model layouts of plugin backbones are
    converted to the model's before mmengine loads them; one log line says what was converted. Checkpoints that
    already fit, and models without plugin backbones, pass through untouched."""
    def load(model, checkpoint, strict=False, logger=None, revise_keys=((r'^module\.', ''), )):
        sd = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, Mapping) else None
        if isinstance(sd, Mapping) and sd:
            revised = dict(sd)
            for pattern, repl in revise_keys:
                revised = {re.sub(pattern, repl, str(k)): v for k, v in revised.items()}
            conversion = convert_model_state_dict(model, revised)
            if conversion.changed:
                from mmengine.logging import print_log
                print_log(conversion.describe(), logger=logger or 'current')
                converted = OrderedDict(conversion.state_dict)
                converted._metadata = getattr(sd, '_metadata', OrderedDict())  # module versions (BatchNorm)
                checkpoint = ({**checkpoint, 'state_dict': converted} if 'state_dict' in checkpoint else converted)
                revise_keys = ()  # already applied: revising twice is not idempotent for every rule
        return original(model, checkpoint, strict, logger, revise_keys=list(revise_keys))

    load.__wrapped__ = original
    return load


def install_converting_loader() -> None:
    """Wrap mmengine's ``_load_checkpoint_to_model`` with :func:`_converting_loader`. Idempotent."""
    global _INSTALLED
    if _INSTALLED:
        return
    import mmengine.runner.checkpoint as mm_ckpt
    import mmengine.runner.runner as mm_runner
    original = mm_ckpt._load_checkpoint_to_model
    mm_ckpt._load_checkpoint_to_model = _converting_loader(original)
    # modules that imported the function by name before this ran keep their own reference (mmengine's Runner and
    # BaseInferencer, mmdet's DetInferencer, mmseg's MMSegInferencer, when imported before mmplugin): rebind it
    # there too. Modules imported later read the converting one from mmengine.runner.checkpoint.
    for module in [mm_runner, *list(sys.modules.values())]:
        if getattr(module, '__dict__', {}).get('_load_checkpoint_to_model') is original:
            module._load_checkpoint_to_model = mm_ckpt._load_checkpoint_to_model
    _INSTALLED = True
