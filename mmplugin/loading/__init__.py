"""Loading that knows the model: above :mod:`mmplugin.models`, below the tools.

* :mod:`.whole_model`: published whole-model layouts (official Swin repositories, mmdet / mmseg zoos) converted to
  the layout of the plugin backbones inside a detector or segmentor, with each family's own converter;
* :mod:`.fit`: does a checkpoint fit the model (or the part of it in use), and loading it checked;
* :mod:`.mmengine`: the same conversion whenever mmengine loads a checkpoint into a model (installed on
  ``import mmplugin``).

File reading and key comparison on plain dicts are :mod:`mmplugin.checkpoint`, which knows no model.
"""
from __future__ import annotations

from mmplugin.loading.fit import (
    PART_CHILDREN,
    check_checkpoint_fits,
    checkpoint_fit,
    load_checkpoint_checked,
    strict_model_state_dict,
)
from mmplugin.loading.mmengine import install_converting_loader
from mmplugin.loading.whole_model import convert_model_state_dict, state_dict_of, unwrap_model

__all__ = ['PART_CHILDREN', 'check_checkpoint_fits', 'checkpoint_fit', 'load_checkpoint_checked',
           'strict_model_state_dict', 'install_converting_loader', 'convert_model_state_dict', 'state_dict_of',
           'unwrap_model']
