"""Parameters and multiply-accumulates of the plugin's backbones and of whole detectors / segmentors.

Counted with mmengine's jit-trace ``FlopAnalyzer`` (one MAC per fused multiply-add, the convention of the SwiftFormer
and Swin papers), plus a handler for ``scaled_dot_product_attention``, which the analyzer does not count by itself.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

__all__ = ['backbone_complexity', 'model_complexity', 'flop_analyzer']


def _sdpa_handle(inputs, outputs):
    """MACs of ``scaled_dot_product_attention``: ``q k^T`` and ``attn v``."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(x) for x in inputs[:3])
    *batch, n, d = q
    m, dv = k[-2], v[-1]
    count = 1
    for b in batch:
        count *= b
    return count * n * m * (d + dv)


def flop_analyzer(model: nn.Module, x: torch.Tensor):
    """mmengine's ``FlopAnalyzer`` of ``model(x)`` that also counts fused attention (SDPA: ``N * M * (d + dv)``
    MACs per batch entry), warnings off; ``.total()`` is the MAC count."""
    from mmengine.analysis import FlopAnalyzer
    fa = FlopAnalyzer(model, (x, ))
    fa.set_op_handle('aten::scaled_dot_product_attention', _sdpa_handle)
    fa.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return fa


def backbone_complexity(family: str, arch: str, size: tuple[int, int]) -> tuple[int, float]:
    """``(parameters, GMACs)`` of backbone ``family``/``arch`` on a ``(1, 3, *size)`` input (its output norms
    included, no classifier)."""
    from mmplugin.models.backbones.base import get_family
    model = get_family(family)(arch).eval()
    params = sum(p.numel() for p in model.parameters())
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter('ignore')
        macs = flop_analyzer(model, torch.zeros(1, 3, *size)).total() / 1e9
    return params, macs


def _fixed_proposals(num: int, width: int, height: int):
    """``(num, 4)`` boxes spread over the image (fixed seed): the RoI heads' cost depends on how many, not where."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(num, 2, generator=g) * torch.tensor([width * 0.75, height * 0.75])
    wh = (0.05 + torch.rand(num, 2, generator=g) * 0.2) * torch.tensor([width, height])
    return torch.cat([xy, xy + wh], dim=1)


def _flat(*outputs) -> tuple:
    """Nested tuples / lists / dicts of tensors -> one flat tuple (what jit tracing accepts as outputs)."""
    flat = []
    for out in outputs:
        if isinstance(out, torch.Tensor):
            flat.append(out)
        elif isinstance(out, dict):
            flat.extend(_flat(*out.values()))
        elif isinstance(out, (list, tuple)):
            flat.extend(_flat(*out))
    return tuple(flat)


def _whole_model_forward(model, width: int, height: int, num_rois: int):
    """A module running ``model`` on a ``(1, 3, height, width)`` tensor without data-dependent control flow.

    Detectors with an RPN + RoI head get ``num_rois`` fixed proposals instead of the RPN's (a random-weight RPN
    keeps an arbitrary number after NMS) and run their RoI head's ``forward`` on them (every box and mask head
    stage, HTC's semantic head once). Everything else runs ``model._forward`` (mmdet / mmseg tensor mode).
    """
    class WholeModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, img):
            if getattr(model, 'with_rpn', False) and getattr(model, 'with_roi_head', False):
                from mmdet.structures import DetDataSample
                from mmengine.structures import InstanceData
                meta = dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width),
                            batch_input_shape=(height, width), scale_factor=(1., 1.))
                x = model.extract_feat(img)
                rpn = model.rpn_head(x)
                proposals = InstanceData(bboxes=_fixed_proposals(num_rois, width, height).to(img.device))
                return _flat(rpn, model.roi_head(x, [proposals], [DetDataSample(metainfo=meta)]))
            return _flat(model._forward(img))

    return WholeModel()


def model_complexity(config: str, shape=(1280, 800), num_proposals: int = 1000, num_mask_rois: int = 100) -> dict:
    """Parameters and multiply-accumulates of the whole model of an mmdet / mmseg config.

    Two-stage detectors are counted the way mmdet's FLOP counter did when the Swin paper was written (2.x
    ``forward_dummy``): box heads on ``num_proposals`` proposals, mask heads on the first ``num_mask_rois``. mmdet
    3.x's RoI ``forward`` runs the mask heads on every proposal, so the model runs on ``min(num_proposals,
    num_mask_rois)`` fixed proposals and the box heads' share, which is linear in the RoI count, is scaled up.

    Args:
        config: config file (or Config); the backbone's ``init_cfg`` is dropped (nothing is downloaded or loaded).
        shape: ``(width, height)`` of the input, e.g. the Swin paper's detection FLOPs at 1280x800.
        num_proposals, num_mask_rois: RoIs of the box and the mask heads (two-stage detectors only).

    Returns:
        ``dict(params, macs, attention_macs, modules)``: ``macs`` counts every matrix product, the attention
        products ``q k^T`` and ``attn v`` included; ``attention_macs`` is their part (mmcv 1.x's module-hook
        counter, which mmdet 2.x's get_flops used, leaves them out); ``modules`` splits ``macs`` by the model's
        top-level children (each neck of a list of necks separately).
    """
    from mmengine.model import revert_sync_batchnorm

    import mmplugin  # noqa: F401  (registers the plugin's models)
    from mmplugin.apis import load_config
    cfg = load_config(config)
    if cfg.model.get('backbone', {}).get('init_cfg'):
        cfg.model.backbone.init_cfg = None
    if cfg.get('default_scope', 'mmdet') == 'mmseg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    model = revert_sync_batchnorm(MODELS.build(cfg.model)).eval()
    params = sum(p.numel() for p in model.parameters())
    width, height = shape
    num_rois = min(num_proposals, num_mask_rois)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter('ignore')
        fa = flop_analyzer(_whole_model_forward(model, width, height, num_rois), torch.zeros(1, 3, height, width))
        by_module = dict(fa.by_module())
        by_operator = fa.by_operator()
    attention = by_operator.get('scaled_dot_product_attention', 0) + by_operator.get('matmul', 0) + \
        by_operator.get('bmm', 0)
    if num_proposals > num_rois:  # box heads and their RoI extractor cost the same per RoI
        for name in ('model.roi_head.bbox_head', 'model.roi_head.bbox_roi_extractor'):
            extra = by_module.get(name, 0) * (num_proposals - num_rois) // num_rois
            for scope in ('', 'model', 'model.roi_head', name):
                by_module[scope] = by_module.get(scope, 0) + extra
    modules = {}
    for name, child in model.named_children():
        if isinstance(child, torch.nn.Sequential):  # a list of necks: one entry each
            modules.update({f'{name}.{i}': by_module.get(f'model.{name}.{i}', 0) for i in range(len(child))})
        else:
            modules[name] = by_module.get(f'model.{name}', 0)
    return dict(params=params, macs=by_module[''], attention_macs=attention,
                modules={k: v for k, v in modules.items() if v})


