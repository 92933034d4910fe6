"""RoI feature extraction with the plugin's :class:`mmplugin.ops.RoIAlign` in mmdet's RoI heads.

mmdet's ``SingleRoIExtractor`` looks a string ``roi_layer.type`` up in ``mmcv.ops`` only, so a config cannot name an
operator of another package there. ``type='mmplugin.SingleRoIExtractor'`` builds mmdet's own ``SingleRoIExtractor``
(the same class, arguments and state dict) after resolving a ``roi_layer.type`` of the ``mmplugin`` scope::

    bbox_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign'))

Every other ``roi_layer.type`` (``'RoIAlign'``, ``'RoIPool'`` ... of ``mmcv.ops``) passes through unchanged.
"""
from __future__ import annotations

from mmplugin.ops.roi_align import layer_class
from mmplugin.registry import MODELS

__all__ = ['roi_align_layer', 'single_roi_extractor', 'use_mmcv_roi_align']


@MODELS.register_module(name='RoIAlign')
def roi_align_layer(*args, **kwargs):
    """``mmplugin.RoIAlign``: :class:`mmplugin.ops.RoIAlign` (a subclass of ``mmcv.ops.RoIAlign``, created on first
    use so that importing the plugin does not load mmcv's compiled ops) with mmcv's arguments."""
    return layer_class()(*args, **kwargs)


@MODELS.register_module(name='SingleRoIExtractor')
def single_roi_extractor(roi_layer: dict, **kwargs):
    """mmdet's ``SingleRoIExtractor(roi_layer=..., **kwargs)`` with ``roi_layer.type`` resolved in the plugin's
    registry when it names the ``mmplugin`` scope.

    Raises:
        KeyError: ``roi_layer.type`` names the ``mmplugin`` scope but no operator registered there.
    """
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    layer = dict(roi_layer)
    kind = layer.get('type')
    if isinstance(kind, str) and kind.startswith('mmplugin.'):
        build = MODELS.get(kind)
        if build is not roi_align_layer:
            raise KeyError(f'roi_layer type {kind!r} is not an operator of mmplugin (known: mmplugin.RoIAlign)')
        layer['type'] = build
    return SingleRoIExtractor(roi_layer=layer, **kwargs)


def use_mmcv_roi_align(model) -> int:
    """Replace every :class:`mmplugin.ops.RoIAlign` in ``model`` by ``mmcv.ops.RoIAlign`` with the same settings (in
    place; the layers hold no parameters), e.g. to time a detector as mmdet's own config builds it. Returns how many
    were replaced."""
    from mmcv.ops import RoIAlign as MmcvRoIAlign
    ours, replaced = layer_class(), 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is ours:
                setattr(parent, name, MmcvRoIAlign(child.output_size, child.spatial_scale, child.sampling_ratio,
                                                   child.pool_mode, child.aligned, child.use_torchvision))
                replaced += 1
    return replaced
