"""Whole-model (detector / segmentor) checkpoints in any published layout -> a model with plugin backbones.

A detector or segmentor checkpoint is the backbone's weights under ``backbone.`` plus the neck's and heads' weights.
The published ones differ from the plugin's own only in the backbone part:

* the official Swin detection / segmentation repositories (mmdet 2.x / mmseg 0.x era): the official backbone names,
  which the plugin keeps, plus the persistent ``relative_position_index`` buffers (and ``attn_mask`` where saved);
* mmdet 3.x's / mmseg 1.x's model zoos: mmdet's ``SwinTransformer`` layout (``patch_embed.projection``,
  ``stages.i.blocks.j.attn.w_msa.*``, ``ffn.layers.*``, ``nn.Unfold`` patch-merging order);
* the plugin's own files (nothing to convert).

Necks and heads have the same keys and shapes in mmdet 2.x and 3.x and in mmseg 0.x and 1.x for the models the
plugin mirrors (Mask R-CNN, Cascade Mask R-CNN, RetinaNet, ATSS, Sparse R-CNN, HTC, UperNet + FCN), so they are
taken as they are. :func:`convert_model_state_dict` finds every plugin backbone inside a model, converts the
checkpoint keys under its prefix with the family's converter (the same pure function ``init_cfg`` uses) and leaves
the rest alone; whether the result fits is decided by :func:`mmplugin.loading.fit.check_checkpoint_fits` (tools)
or by mmengine's loader (``load_from``), never here.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from mmplugin.checkpoint import CheckpointError, state_dict_mismatch, strip_module_prefix
from mmplugin.checkpoint.convert import unwrap_state_dict
from mmplugin.models.backbones.base import BaseBackbone

__all__ = [
    'BackboneConversion', 'ModelConversion', 'convert_model_state_dict', 'plugin_backbones',
    'layout_name', 'backbone_file_layout', 'unwrap_model', 'state_dict_of'
]

# (family, layout reported by the family's detector) -> the name the log line and messages use
_LAYOUT_NAMES = {
    ('swin', 'official'): 'official Swin (microsoft/Swin-Transformer and its detection / segmentation repositories)',
    ('swinv2', 'official'): 'official Swin V2 (microsoft/Swin-Transformer)',
    ('swin', 'openmmlab'): 'OpenMMLab (mmdet / mmseg / mmpretrain SwinTransformer)',
    ('swinv2', 'openmmlab'): 'OpenMMLab (mmpretrain SwinTransformerV2)',
    ('swin', 'timm'): 'timm',
    ('swinv2', 'timm'): 'timm',
    ('swiftformer', 'official'): 'official SwiftFormer (Amshaker/SwiftFormer)',
    ('swiftformer', 'timm'): 'timm',
}


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside any wrappers that hold it as ``.module`` (DDP, FSDP, mmengine's wrappers, TTA)."""
    while hasattr(model, 'module') and isinstance(model.module, nn.Module):
        model = model.module
    return model


def state_dict_of(ckpt: object) -> Mapping | None:
    """The whole-model state dict of a loaded checkpoint (``{'state_dict': ...}`` or a plain dict) with ``module.``
    prefixes removed; None when it holds none."""
    sd = ckpt.get('state_dict', ckpt) if isinstance(ckpt, Mapping) else None
    return strip_module_prefix(sd) if isinstance(sd, Mapping) else None


def layout_name(family: str, sd: Mapping[str, torch.Tensor]) -> str:
    """Human-readable name of the layout of backbone state dict ``sd`` (keys relative to the backbone)."""
    from mmplugin.models.backbones.swiftformer.converter import detect_swiftformer_layout
    from mmplugin.models.backbones.swin.converter import detect_swin_layout
    detectors = {'swin': detect_swin_layout, 'swinv2': detect_swin_layout, 'swiftformer': detect_swiftformer_layout}
    try:
        layout = detectors[family](dict(sd)) if family in detectors else 'unknown'
    except CheckpointError:
        return 'unrecognised'
    return _LAYOUT_NAMES.get((family, layout), layout)


def plugin_backbones(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(prefix, module)`` of every plugin backbone below the model's root (``'backbone.'`` for detectors and
    segmentors), outermost first; model wrappers (DDP, TTA) are looked through like any other container."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if not name or not isinstance(m, BaseBackbone):
            continue
        if any(name.startswith(p) for p, _ in found):  # a backbone inside a backbone belongs to the outer one
            continue
        found.append((name + '.', m))
    return found


def backbone_file_layout(model: nn.Module, ckpt: object) -> str | None:
    """The layout name when ``ckpt`` is a backbone-only file for the model's ``backbone`` (an ImageNet classifier,
    an mmdet / mmpretrain / timm backbone file: no ``backbone.`` keys, recognised by the family's ``detect``), else
    None. Such a file initialises a backbone through ``init_cfg``; it cannot be evaluated as a whole model."""
    try:
        sd = unwrap_state_dict(ckpt)
    except CheckpointError:
        return None
    try:
        unwrap_state_dict(ckpt, prefix='backbone.')
        return None  # a whole-model file (in any container), not a backbone-only one
    except CheckpointError:
        pass  # no key starts with backbone.
    for prefix, backbone in plugin_backbones(model):
        cls = type(backbone)
        if prefix == 'backbone.' and cls.detect(sd):
            name = layout_name(cls.family or cls.__name__, sd)
            return None if name in ('unrecognised', 'unknown') else name
    return None


def _fits(sd: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> bool:
    """Same keys (BatchNorm counters optional) and shapes: :func:`mmplugin.checkpoint.state_dict_mismatch`."""
    return not any(state_dict_mismatch(sd, own))


@dataclass
class BackboneConversion:
    """What happened to the keys under one backbone prefix."""
    prefix: str
    family: str
    layout: str  # human-readable source layout
    converted: bool  # False: already in the model's layout (or conversion refused, see ``error``)
    num_tensors: int = 0
    dropped: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class ModelConversion:
    """Result of :func:`convert_model_state_dict`: the state dict to load and what was done to it."""
    state_dict: dict[str, torch.Tensor]
    backbones: list[BackboneConversion] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(b.converted for b in self.backbones)

    def describe(self) -> str | None:
        """One line naming what was converted from which layout; None when nothing was."""
        parts = []
        for b in self.backbones:
            if b.converted:
                derived = [k for k in b.dropped if k.rsplit('.', 1)[-1] in _DERIVED_NAMES]
                other = [k for k in b.dropped if k not in derived]
                note = f'; dropped {len(derived)} derived buffers (regenerated by the model)' if derived else ''
                note += f'; dropped {len(other)} other keys ({", ".join(other[:3])})' if other else ''
                parts.append(f'{b.prefix.rstrip(".")} ({b.num_tensors} tensors) from the {b.layout} layout to '
                             f'mmplugin\'s {b.family} layout{note}')
        if not parts:
            return None
        return 'whole-model checkpoint: converted ' + '; '.join(parts) + '; all other keys taken as they are'

    def problems(self) -> list[str]:
        """Why a backbone part could not be converted (for the "does not fit" message)."""
        return [f'its {b.prefix.rstrip(".")} part looks like the {b.layout} layout but cannot be converted: '
                f'{b.error}' for b in self.backbones if b.error]


_DERIVED_NAMES = ('relative_position_index', 'relative_coords_table', 'attn_mask')


def _window_problem(backbone: nn.Module, sd: Mapping[str, torch.Tensor]) -> str | None:
    """A Swin V1 checkpoint trained with another window: its bias tables would have to be resized, which is right for
    fine-tuning from an ImageNet file but wrong for evaluating a trained detector; say which window it has."""
    windows = getattr(backbone, 'window_sizes', None)
    if windows is None or getattr(backbone, 'v2', False):
        return None
    for k, v in sd.items():
        if not k.endswith('relative_position_bias_table') or v.ndim != 2:
            continue
        m = re.match(r'(?:layers|stages)\.(\d+)\.', k)
        stage = int(m.group(1)) if m else 0
        side = math.isqrt(v.shape[0])
        if side * side == v.shape[0] and stage < len(windows) and (side + 1) // 2 != windows[stage]:
            return (f'{k} is for window {(side + 1) // 2} but the model has window_size={windows[stage]}: build the '
                    f'model with model.backbone.window_size={(side + 1) // 2} (a trained detector is evaluated with '
                    'the window it was trained with; resizing is for fine-tuning, with init_cfg)')
    return None


def convert_model_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> ModelConversion:
    """Convert the backbone parts of a whole-model state dict to ``model``'s layout.

    Args:
        model: the detector / segmentor (wrappers are unwrapped). Only plugin backbones below the root are
            considered; a model without one gets ``state_dict`` back unchanged.
        state_dict: keys of the whole model (``module.`` prefixes are removed), e.g. ``ckpt['state_dict']``.

    Returns:
        :class:`ModelConversion`. Keys under a backbone prefix that already fit that backbone (keys and shapes)
        are kept as they are; otherwise they are replaced by the family converter's output. A backbone part the
        converter refuses is kept unchanged and the reason recorded (:meth:`ModelConversion.problems`). Nothing
        is checked outside the backbones.
    """
    model = unwrap_model(model)
    sd = strip_module_prefix(state_dict)
    result = ModelConversion(sd)
    for prefix, backbone in plugin_backbones(model):
        sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and isinstance(v, torch.Tensor)}
        if not sub:
            continue
        family = type(backbone).family or type(backbone).__name__
        own = backbone.state_dict()
        if _fits(sub, own):
            result.backbones.append(BackboneConversion(prefix, family, 'mmplugin', False, len(sub)))
            continue
        layout = layout_name(family, sub)
        record = BackboneConversion(prefix, family, layout, False, len(sub))
        result.backbones.append(record)
        if layout == 'unrecognised':
            continue  # another family's or no backbone's weights: the fit check names the keys
        try:
            problem = _window_problem(backbone, sub)
            if problem:
                raise CheckpointError(problem)
            converted, dropped = type(backbone).convert(sub, out_indices=backbone.out_indices)
        except CheckpointError as err:
            record.error = str(err)
            continue
        rest = {k: v for k, v in sd.items() if not k.startswith(prefix)}
        sd = {**{prefix + k: v for k, v in converted.items()}, **rest}
        record.converted, record.dropped = True, list(dropped)
        result.state_dict = sd
    return result
