"""Multi-scale + flip test-time augmentation for detectors that predict boxes and instance masks.

mmdet 3.3's ``DetTTAModel`` merges boxes only: it refuses views with ``pred_instances.masks`` ("TTA of instance
segmentation does not support now"), so a Mask R-CNN / Cascade / HTC cannot be tested with ``--tta`` through it.
:class:`MaskDetTTAModel` merges the same way for boxes (un-flip every view's boxes in the original image frame,
concatenate, class-wise NMS or soft-NMS, keep ``max_per_img``) and carries each kept detection's mask along from
the view that produced it, un-flipped the same way. An image without any detection gets empty predictions.
"""
from __future__ import annotations

from typing import List

import torch
from mmengine.model import BaseTTAModel
from mmengine.structures import InstanceData

from mmplugin.registry import MODELS

__all__ = ['MaskDetTTAModel', 'flip_masks']


def flip_masks(masks: torch.Tensor, direction: str) -> torch.Tensor:
    """Undo (or apply) a flip of ``(N, H, W)`` masks: ``horizontal`` / ``vertical`` / ``diagonal`` (both)."""
    dims = {'horizontal': [-1], 'vertical': [-2], 'diagonal': [-2, -1]}.get(direction)
    if dims is None:
        raise ValueError(f'unknown flip direction {direction!r}')
    return masks.flip(dims)


@MODELS.register_module()
class MaskDetTTAModel(BaseTTAModel):
    """Merge the predictions of the views of one image (``TestTimeAug``: scales x flips) into one.

    Args:
        module (dict | nn.Module): the detector.
        tta_cfg (dict): ``nms`` (an mmcv ``batched_nms`` config: ``type='nms'`` or ``'soft_nms'``,
            ``iou_threshold``) and ``max_per_img``, as mmdet's ``DetTTAModel``.

    Every view's predictions are already rescaled to the original image (``ori_shape``), flipped when the view was;
    boxes ``(n, 4)`` x1y1x2y2, masks ``(n, H, W)`` at ``ori_shape``.
    """

    def __init__(self, tta_cfg=None, **kwargs):
        super().__init__(**kwargs)
        if not tta_cfg or 'nms' not in tta_cfg or 'max_per_img' not in tta_cfg:
            raise ValueError("MaskDetTTAModel needs tta_cfg=dict(nms=dict(type='nms' or 'soft_nms', "
                             f"iou_threshold=...), max_per_img=...); got {tta_cfg!r}")
        self.tta_cfg = tta_cfg

    def merge_preds(self, data_samples_list: List[list]) -> list:
        """``data_samples_list[i]``: the views of image ``i``; returns one data sample per image."""
        return [self._merge_single_sample(views) for views in data_samples_list]

    def _merge_single_sample(self, views: list):
        from mmcv.ops import batched_nms
        from mmdet.structures.bbox import bbox_flip

        bboxes, scores, labels, masks = [], [], [], []
        with_masks = all('masks' in v.pred_instances for v in views)
        for view in views:
            pred, meta = view.pred_instances, view.metainfo
            b, m = pred.bboxes, pred.masks if with_masks else None
            if meta.get('flip', False):
                b = bbox_flip(b, img_shape=meta['ori_shape'], direction=meta['flip_direction'])
                if m is not None:
                    m = flip_masks(m, meta['flip_direction'])
            bboxes.append(b)
            scores.append(pred.scores)
            labels.append(pred.labels)
            if m is not None:
                masks.append(m)
        bboxes, scores, labels = torch.cat(bboxes), torch.cat(scores), torch.cat(labels)
        masks = torch.cat(masks) if with_masks else None
        if bboxes.numel() == 0:
            keep = torch.zeros(0, dtype=torch.long, device=bboxes.device)
            kept_scores = scores[keep]
        else:
            dets, keep = batched_nms(bboxes, scores, labels, self.tta_cfg['nms'])
            keep = keep[:self.tta_cfg['max_per_img']]
            kept_scores = dets[:self.tta_cfg['max_per_img'], -1]  # soft-NMS lowers the scores it keeps
        results = InstanceData()
        results.bboxes = bboxes[keep]
        results.scores = kept_scores
        results.labels = labels[keep]
        if masks is not None:
            results.masks = masks[keep]
        merged = views[0]
        merged.pred_instances = results
        return merged
