"""mmdeploy 1.3.1 with torch >= 2.9: compatibility shims, and mmdet's post-processing in onnxruntime graphs.

Call :func:`patch_mmdeploy_for_torch2` once before ``mmdeploy.apis.torch2onnx`` / ``mmdeploy.apis.onnx.export``
(``tools/export_mmdeploy.py`` does). What it changes, all through mmdeploy's own rewriter registry (so only while
mmdeploy exports, inside its ``RewriterContext``), except the one added symbol of point 2:

1. ``torch.onnx.export`` is called with ``dynamo=False``: torch >= 2.9 defaults to the torch.export-based exporter,
   on which mmdeploy's function rewriters and symbolic functions do not act.
2. ``torch.onnx.symbolic_opset9._cast_Long`` exists again (torch removed it; mmdeploy's RoIAlign symbolic imports
   it, ``mmdeploy/mmcv/ops/roi_align.py:59``).
3. ``F.scaled_dot_product_attention``: mmdeploy's rewriter (``mmdeploy/pytorch/functions/
   multi_head_attention_forward.py:61-81``) divides the logits by ``scale`` (PyTorch multiplies) and takes the
   positional arguments in another order. With the default ``scale=None`` that is right, with an explicit scale
   it is not: Swin V1 (``scale=head_dim ** -0.5``) got logits ``head_dim`` times too large, in the exported graph
   and in mmdeploy's eager run alike (FPN maps 31-41 % off). Replaced by PyTorch's definition.

With ``mmdet_semantics=True`` (default), for the onnxruntime backend, mmdeploy's rewriters of these heads are
replaced by ones that compute what mmdet's ``predict`` computes (mmdeploy's differ, see below), so that the
exported graph gives mmdet's detections:

* ``RPNHead.predict_by_feat``: NMS per pyramid level (mmdet's ``batched_nms`` by level; mmdeploy runs one NMS
  over all levels), boxes not larger than ``min_bbox_size`` dropped (mmdeploy keeps them), no score threshold
  (mmdeploy applies the deploy config's ``score_threshold`` to proposals).
* ``BBoxHead.predict_by_feat``: class-specific boxes for every class above ``score_thr`` (mmdeploy keeps only the
  box of each RoI's top class and labels it with every class), NMS per class, ``max_per_img`` overall.
* ``CascadeRoIHead.predict_bbox``: class-specific box regression (``reg_class_agnostic=False``, as in the Swin
  Cascade configs) refines each RoI with its top class's deltas (mmdeploy asserts class-agnostic heads).
* ``CascadeRoIHead.predict_mask``: the stages' mask probabilities are averaged (mmdeploy averages logits).

Graph outputs stay mmdeploy's: ``dets (B, K, 5)``, ``labels (B, K)``, ``masks (B, K, 28, 28)`` (probabilities of
each detection's class, before pasting); rows with score 0 are padding (mmdeploy's ``End2EndModel`` drops them and
pastes the masks).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mmplugin.utils.numerics import pairwise_rel_error

__all__ = ['TESTED_MMDEPLOY', 'patch_mmdeploy_for_torch2', 'export_end2end', 'end2end_parity']

TESTED_MMDEPLOY = '1.3.1'
_state = {'base': False, 'heads': False}


# ---------------------------------------------------------------------------------------------- torch shims
def _cast_long(g, x, non_blocking=False):
    return g.op('Cast', x, to_i=7)  # onnx.TensorProto.INT64


def _torchscript_export(*args, **kwargs):
    from mmdeploy.core import FUNCTION_REWRITER
    kwargs.setdefault('dynamo', False)
    return FUNCTION_REWRITER.get_context().origin_func(*args, **kwargs)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` as PyTorch defines it, in ops every opset has."""
    if enable_gqa:
        raise NotImplementedError('scaled_dot_product_attention(enable_gqa=True) is not exportable here')
    scale = query.size(-1)**-0.5 if scale is None else scale
    attn = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        attn = attn.masked_fill(~keep, float('-inf'))
    if attn_mask is not None:
        attn = attn.masked_fill(~attn_mask, float('-inf')) if attn_mask.dtype == torch.bool else attn + attn_mask
    attn = torch.softmax(attn, dim=-1)
    if dropout_p > 0:
        attn = torch.dropout(attn, dropout_p, True)
    return torch.matmul(attn, value)


# ---------------------------------------------------------------------------------------------- heads
def _nms(boxes, scores, nms_boxes, iou_threshold: float, score_threshold: float, max_num: int):
    """Single-class NMS of ``(B, N, 4)`` ``nms_boxes`` (boxes offset per group, as mmcv's ``batched_nms``).

    Returns ``dets (B, K, 5)`` of the original ``boxes`` sorted by score, the kept box indices ``(B, K)`` and
    ``own (B, K)`` (False on padding: rows of other images, and the one zero row appended so K >= 1).
    """
    from mmdeploy.mmcv.ops.nms import ONNXNMSop
    sel = ONNXNMSop.apply(nms_boxes, scores.unsqueeze(1), max_num, iou_threshold, score_threshold)
    b, i = sel[:, 0], sel[:, 2]
    det = torch.cat([boxes[b, i], scores[b, i].unsqueeze(-1)], -1)  # (K, 5)
    det = torch.cat([det, det.new_zeros(1, 5)])
    i = torch.cat([i, i.new_zeros(1)])
    n = boxes.shape[0]
    own = torch.cat([b.unsqueeze(0) == torch.arange(n, device=b.device).unsqueeze(1),
                     torch.zeros(n, 1, dtype=torch.bool, device=b.device)], 1)  # (B, K + 1)
    key = torch.where(own, det[:, 4].unsqueeze(0), det.new_full((1, ), -2.0))
    _, order = key.topk(max_num, dim=1)  # mmdeploy's topk rewriter clips k to the size in the graph
    return det[order], i[order], own.gather(1, order)


def _offsets(boxes, group, valid):
    """mmcv ``batched_nms``: ``group * (max coordinate of the valid boxes + 1)`` added to each box."""
    top = torch.where(valid.unsqueeze(-1), boxes, boxes.new_zeros(1)).max()
    return boxes + (group.to(boxes.dtype) * (top + 1)).unsqueeze(-1)


def _rpn_predict_by_feat(self, cls_scores, bbox_preds, score_factors=None, batch_img_metas=None, cfg=None,
                         rescale=False, with_nms=True, **kwargs):
    """mmdet ``RPNHead.predict_by_feat`` for a batch: per level top ``nms_pre``, decode, drop boxes not larger than
    ``min_bbox_size``, NMS per level, ``max_per_img`` proposals. Returns ``(dets (B, K, 5), labels (B, K))``; padding
    rows repeat the image's best proposal (an exact duplicate RoI changes no detection: NMS removes its copies)."""
    cfg = self.test_cfg if cfg is None else cfg
    img_shape = batch_img_metas[0]['img_shape']
    n = cls_scores[0].shape[0]
    priors = self.prior_generator.grid_priors([c.shape[-2:] for c in cls_scores], device=cls_scores[0].device)
    nms_pre = cfg.get('nms_pre', -1)
    boxes, scores, levels = [], [], []
    for level, (cls, reg, prior) in enumerate(zip(cls_scores, bbox_preds, priors)):
        cls = cls.permute(0, 2, 3, 1)
        score = cls.reshape(n, -1).sigmoid() if self.use_sigmoid_cls else cls.reshape(n, -1, 2).softmax(-1)[..., 0]
        dim = self.bbox_coder.encode_size
        reg = reg.permute(0, 2, 3, 1).reshape(n, -1, dim)
        prior = prior.unsqueeze(0).expand(n, -1, -1)
        if nms_pre > 0:
            score, idx = score.topk(nms_pre, dim=1)
            reg = reg.gather(1, idx.unsqueeze(-1).expand(-1, -1, dim))
            prior = prior.gather(1, idx.unsqueeze(-1).expand(-1, -1, prior.shape[-1]))
        boxes.append(self.bbox_coder.decode(prior, reg, max_shape=img_shape))
        scores.append(score)
        levels.append(torch.full_like(score, level))
    boxes, scores, levels = torch.cat(boxes, 1), torch.cat(scores, 1), torch.cat(levels, 1)
    if not with_nms:
        return boxes, scores.unsqueeze(-1)
    valid = torch.ones_like(scores, dtype=torch.bool)
    if cfg.get('min_bbox_size', -1) >= 0:
        valid = ((boxes[..., 2] - boxes[..., 0]) > cfg.min_bbox_size) & \
            ((boxes[..., 3] - boxes[..., 1]) > cfg.min_bbox_size)
    if cfg.nms.get('type', 'nms') != 'nms':
        raise NotImplementedError(f'RPN nms type {cfg.nms.type!r}: only nms is exported')
    scores = torch.where(valid, scores, scores.new_zeros(1))  # 0: removed by the NMS score threshold below
    dets, _, own = _nms(boxes, scores, _offsets(boxes, levels, valid), cfg.nms.iou_threshold, 0.0, cfg.max_per_img)
    dets = torch.where((own & (dets[..., 4] > 0)).unsqueeze(-1), dets, dets[:, :1])
    return dets, dets.new_zeros(dets.shape[:2], dtype=torch.long)


def _bbox_predict_by_feat(self, rois, cls_scores, bbox_preds, batch_img_metas, rcnn_test_cfg=None, rescale=False):
    """mmdet ``BBoxHead.predict_by_feat`` + ``multiclass_nms`` for a batch: ``rois (B, R, 5)``, ``cls_scores
    (B, R, C + 1)``, ``bbox_preds (B, R, 4 or 4C)`` -> ``(dets (B, K, 5), labels (B, K))``, zero rows as padding."""
    if bbox_preds is None:
        raise NotImplementedError('bbox heads without regression are not exported by mmplugin.export.mmdeploy')
    cfg = rcnn_test_cfg
    if cfg.nms.get('type', 'nms') != 'nms':
        raise NotImplementedError(f'R-CNN nms type {cfg.nms.type!r}: only nms is exported')
    scores = self.loss_cls.get_activation(cls_scores) if self.custom_cls_channels else F.softmax(cls_scores, dim=-1)
    n, r = scores.shape[:2]
    c = self.num_classes
    boxes = self.bbox_coder.decode(rois[..., 1:], bbox_preds, max_shape=batch_img_metas[0]['img_shape'])
    boxes = boxes.reshape(n, r, -1, 4).expand(-1, -1, c, -1).reshape(n, r * c, 4)  # class-agnostic: shared box
    scores = scores[..., :c].reshape(n, r * c)
    label = torch.arange(r * c, device=scores.device) % c
    valid = scores > cfg.score_thr
    dets, idx, own = _nms(boxes, scores, _offsets(boxes, label.unsqueeze(0), valid), cfg.nms.iou_threshold,
                          cfg.score_thr, cfg.max_per_img)
    dets = torch.where(own.unsqueeze(-1), dets, dets.new_zeros(1))
    return dets, torch.where(own, label[idx], label.new_zeros(1))


def _cascade_predict_bbox(self, x, batch_img_metas, rpn_results_list, rcnn_test_cfg, rescale=False, **kwargs):
    """mmdet ``CascadeRoIHead.predict_bbox``: each stage but the last refines the RoIs (with the deltas of each
    RoI's top class when the head regresses per class); scores are the stages' mean."""
    from mmdet.structures.bbox import get_box_tensor
    props = rpn_results_list[0]
    n, r = props.shape[:2]
    index = torch.arange(n, device=props.device).to(props.dtype).view(-1, 1, 1).expand(-1, r, 1)
    rois = torch.cat([index, props[..., :4]], -1)
    stage_scores = []
    for i in range(self.num_stages):
        res = self._bbox_forward(i, x, rois.reshape(-1, 5), **kwargs)
        cls, reg = res['cls_score'].reshape(n, r, -1), res['bbox_pred'].reshape(n, r, -1)
        stage_scores.append(cls)
        if i < self.num_stages - 1:
            head = self.bbox_head[i]
            if not head.reg_class_agnostic:
                act = head.loss_cls.get_activation(cls) if head.custom_activation else cls
                top = act[..., :-1].argmax(-1, keepdim=True).unsqueeze(-1)  # (B, R, 1, 1)
                dim = head.bbox_coder.encode_size
                reg = reg.reshape(n, r, -1, dim).gather(2, top.expand(-1, -1, 1, dim)).squeeze(2)
            boxes = get_box_tensor(head.bbox_coder.decode(rois[..., 1:], reg,
                                                          max_shape=batch_img_metas[0]['img_shape']))
            rois = torch.cat([index, boxes], -1)
    return self.bbox_head[-1].predict_by_feat(rois=rois, cls_scores=sum(stage_scores) / len(stage_scores),
                                              bbox_preds=reg, batch_img_metas=batch_img_metas,
                                              rcnn_test_cfg=rcnn_test_cfg, rescale=rescale)


def _cascade_predict_mask(self, x, batch_img_metas, results_list, rescale=False):
    """mmdet ``CascadeRoIHead.predict_mask``: mean of the stages' mask probabilities, the detection's class."""
    from mmdeploy.codebase.mmdet.deploy import get_post_processing_params
    from mmdeploy.core import FUNCTION_REWRITER
    if get_post_processing_params(FUNCTION_REWRITER.get_context().cfg).get('export_postprocess_mask', False):
        raise NotImplementedError('Cascade masks: export with export_postprocess_mask=False (pasted in Python)')
    dets, labels = results_list
    n, k = dets.shape[:2]
    index = torch.arange(n, device=dets.device).to(dets.dtype).view(-1, 1, 1).expand(-1, k, 1)
    rois = torch.cat([index, dets[..., :4]], -1).reshape(-1, 5)
    probs = sum(self._mask_forward(i, x, rois)['mask_preds'].sigmoid() for i in range(self.num_stages))
    probs = probs / self.num_stages
    if self.mask_head[-1].class_agnostic:
        masks = probs[:, 0]
    else:
        masks = probs[torch.arange(probs.shape[0], device=probs.device), labels.reshape(-1)]
    return dets, labels, masks.reshape(n, k, masks.shape[-2], masks.shape[-1])


_HEADS = {
    'mmdet.models.dense_heads.rpn_head.RPNHead.predict_by_feat': _rpn_predict_by_feat,
    'mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead.predict_by_feat': _bbox_predict_by_feat,
    'mmdet.models.roi_heads.cascade_roi_head.CascadeRoIHead.predict_bbox': _cascade_predict_bbox,
    'mmdet.models.roi_heads.cascade_roi_head.CascadeRoIHead.predict_mask': _cascade_predict_mask,
}


def patch_mmdeploy_for_torch2(mmdet_semantics: bool = True) -> None:
    """Make mmdeploy (tested: 1.3.1) export with torch >= 2.9 (items 1-3 of the module doc); with ``mmdet_semantics``
    also register the onnxruntime head rewriters that reproduce mmdet's post-processing. Idempotent."""
    import mmdeploy
    from mmdeploy.core import FUNCTION_REWRITER
    if not _state['base']:
        if mmdeploy.__version__ != TESTED_MMDEPLOY:
            import warnings
            warnings.warn(f'mmplugin.export.mmdeploy is tested with mmdeploy {TESTED_MMDEPLOY}, '
                          f'found {mmdeploy.__version__}')
        import torch.onnx.symbolic_opset9 as opset9
        if not hasattr(opset9, '_cast_Long'):
            opset9._cast_Long = _cast_long
        FUNCTION_REWRITER.register_rewriter('torch.onnx.export')(_torchscript_export)
        from mmdeploy.pytorch.functions import multi_head_attention_forward as mha
        FUNCTION_REWRITER._registry.remove_record(mha.scaled_dot_product_attention__default)
        FUNCTION_REWRITER.register_rewriter('torch.nn.functional.scaled_dot_product_attention')(_sdpa)
        _state['base'] = True
    if mmdet_semantics and not _state['heads']:
        from mmdeploy.codebase import import_codebase
        from mmdeploy.utils import Codebase
        import_codebase(Codebase.MMDET)  # mmdeploy's own rewriters first; ours (backend-specific) take precedence
        for name, fn in _HEADS.items():
            FUNCTION_REWRITER.register_rewriter(name, backend='onnxruntime')(fn)
        _state['heads'] = True


# ---------------------------------------------------------------------------------------------- export + parity
def _samples(n: int, h: int, w: int):
    from mmdet.structures import DetDataSample
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    return [DetDataSample(metainfo=dict(meta)) for _ in range(n)]


def export_end2end(model: torch.nn.Module, deploy_cfg, example: torch.Tensor, out: str,
                   mmdet_semantics: bool = True) -> str:
    """Export an mmdet two-stage detector end to end with mmdeploy (``mmdeploy.apis.onnx.export``, what
    ``mmdeploy.apis.torch2onnx`` calls after building the model and an example input).

    Args:
        model: the detector (eval mode; weights loaded by the caller, e.g. weights-only).
        deploy_cfg: mmdeploy deploy config (path or Config), e.g. ``configs/deploy/maskrcnn_onnxruntime_dynamic.py``.
        example: ``(B, 3, H, W)`` preprocessed image batch used for tracing (any values; its size is the static
            size if the deploy config fixes one).
        out: the ``.onnx`` path to write. Returns it.
        mmdet_semantics: passed to :func:`patch_mmdeploy_for_torch2` (once registered, the heads stay).
    """
    import copy
    import os.path as osp

    from mmdeploy.apis.onnx import export
    from mmdeploy.codebase import import_codebase
    from mmdeploy.utils import Codebase, get_dynamic_axes, get_ir_config, load_config
    import_codebase(Codebase.MMDET)  # mmdeploy's mmdet rewriters (torch2onnx imports them via its task processor)
    patch_mmdeploy_for_torch2(mmdet_semantics)
    deploy_cfg = load_config(deploy_cfg)[0]
    onnx_cfg = get_ir_config(deploy_cfg)
    names = onnx_cfg['input_names'] + onnx_cfg['output_names']
    n, _, h, w = example.shape
    export(copy.deepcopy(model).eval(), example, input_metas={'data_samples': _samples(n, h, w), 'mode': 'predict'},
           output_path_prefix=osp.splitext(out)[0], backend='onnxruntime', input_names=onnx_cfg['input_names'],
           output_names=onnx_cfg['output_names'], context_info=dict(deploy_cfg=deploy_cfg),
           opset_version=onnx_cfg.get('opset_version', 11), dynamic_axes=get_dynamic_axes(deploy_cfg, names),
           verbose=False, keep_initializers_as_inputs=onnx_cfg.get('keep_initializers_as_inputs', False),
           optimize=False)
    return out


def end2end_parity(model: torch.nn.Module, session, image: torch.Tensor, box_tol: float = 1e-3) -> dict:
    """onnxruntime (``session`` of an :func:`export_end2end` graph, masks pasted as mmdeploy's ``End2EndModel``)
    against ``model.predict`` (``rescale=False``) on one preprocessed ``image (1, 3, H, W)``.

    Each ONNX detection is matched to the unused mmdet detection of the same label with the nearest box. Returns
    ``num_onnx`` / ``num_torch`` (detections with score > 0), ``matched`` (box within ``box_tol`` relative),
    ``box_err`` (worst matched), ``score_err`` (worst matched, absolute), ``mask_iou`` (lowest matched, binary
    masks at the model's ``mask_thr_binary``; None without masks).
    """
    from mmdeploy.codebase.mmdet.deploy.object_detection_model import End2EndModel
    h, w = image.shape[-2:]
    outs = session.run(None, {session.get_inputs()[0].name: image.numpy()})
    dets, labels = torch.from_numpy(outs[0][0]), torch.from_numpy(outs[1][0])
    keep = dets[:, 4] > 0
    dets, labels = dets[keep], labels[keep]
    with torch.no_grad():
        ref = model.predict(image, _samples(1, h, w), rescale=False)[0].pred_instances
    ref_dets = torch.cat([ref.bboxes, ref.scores[:, None]], 1)
    err = (pairwise_rel_error(dets[:, :4], ref_dets[:, :4]) if len(dets) and len(ref_dets) else
           torch.zeros(len(dets), len(ref_dets), dtype=torch.float64))
    err = torch.where(labels[:, None] == ref.labels[None, :], err, torch.full_like(err, float('inf')))
    pairs, used = [], set()
    for i in range(len(dets)):
        free = [j for j in err[i].argsort().tolist() if j not in used and err[i, j] <= box_tol]
        if free:
            pairs.append((i, free[0]))
            used.add(free[0])
    res = dict(num_onnx=len(dets), num_torch=len(ref_dets), matched=len(pairs),
               box_err=max((err[i, j].item() for i, j in pairs), default=0.0),
               score_err=max((abs(dets[i, 4] - ref_dets[j, 4]).item() for i, j in pairs), default=0.0),
               mask_iou=None)
    if len(outs) > 2 and 'masks' in ref:
        thr = model.roi_head.test_cfg.get('mask_thr_binary', 0.5)
        masks = torch.from_numpy(outs[2][0])[keep]
        pasted = End2EndModel.postprocessing_masks(dets[:, :4], masks, w, h) >= thr if len(dets) else masks
        ious = []
        for i, j in pairs:
            union = (pasted[i] | ref.masks[j]).sum().item()
            ious.append(1.0 if union == 0 else (pasted[i] & ref.masks[j]).sum().item() / union)
        res['mask_iou'] = min(ious, default=1.0)
    return res
