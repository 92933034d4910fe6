"""RoI feature extraction with the plugin's :class:`mmplugin.ops.RoIAlign` in mmdet's RoI heads.

mmdet's ``SingleRoIExtractor`` looks a string ``roi_layer.type`` up in ``mmcv.ops`` only, so a config cannot name an
operator of another package there. ``type='mmplugin.SingleRoIExtractor'`` builds mmdet's own ``SingleRoIExtractor``
(the same class, arguments and state dict) after resolving a ``roi_layer.type`` of the ``mmplugin`` scope::

    bbox_roi_extractor=dict(type='mmplugin.SingleRoIExtractor', roi_layer=dict(type='mmplugin.RoIAlign'))

Every other ``roi_layer.type`` (``'RoIAlign'``, ``'RoIPool'`` ... of ``mmcv.ops``) passes through unchanged.
"""
from __future__ import annotations

from mmplugin.ops.roi_align import RoIAlign
from mmplugin.registry import MODELS

__all__ = ['RoIAlign', 'single_roi_extractor', 'use_mmcv_roi_align']

MODELS.register_module(name='RoIAlign', module=RoIAlign)


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
        cls = MODELS.get(kind)
        if cls is None or not isinstance(cls, type):
            raise KeyError(f'roi_layer type {kind!r} is not an operator of mmplugin (known: mmplugin.RoIAlign)')
        layer['type'] = cls
    return SingleRoIExtractor(roi_layer=layer, **kwargs)


def use_mmcv_roi_align(model) -> int:
    """Replace every :class:`mmplugin.ops.RoIAlign` in ``model`` by ``mmcv.ops.RoIAlign`` with the same settings (in
    place; the layers hold no parameters), e.g. to time a detector as mmdet's own config builds it. Returns how many
    were replaced."""
    from mmcv.ops import RoIAlign as MmcvRoIAlign
    replaced = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, RoIAlign):
                setattr(parent, name, MmcvRoIAlign(child.output_size, child.spatial_scale, child.sampling_ratio,
                                                   child.pool_mode, child.aligned, child.use_torchvision))
                replaced += 1
    return replaced
