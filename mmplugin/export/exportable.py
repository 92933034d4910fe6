"""Exportable forms of a model: the parts an export produces (:class:`ExportPart`) and in-place rewrites of modules
whose forward would bake the example's size into a captured graph (:func:`make_exportable`).

Parts (``image (B, C, H, W)`` in, a tuple of tensors out):

* ``backbone``: the backbone's NCHW feature maps;
* ``backbone+neck``: the neck's maps (FPN levels) when the model has a neck;
* ``model``: segmentors (mmseg ``EncoderDecoder``: Semantic FPN, UperNet): ``(B, num_classes, H, W)`` logits,
  i.e. the decode head's output resized to the input like ``EncoderDecoder.encode_decode``; single-stage
  detectors: the dense head's raw maps (per level class scores, box deltas, ...). Two-stage detectors need NMS
  and RoIAlign: export them end to end with mmdeploy (``tools/export_mmdeploy.py``, :mod:`mmplugin.export.mmdeploy`),
  or export ``backbone+neck``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ['PARTS', 'flatten_outputs', 'adaptive_pool_matrix', 'make_exportable', 'ExportPart']

PARTS = ('backbone', 'backbone+neck', 'model')


def flatten_outputs(out) -> tuple[torch.Tensor, ...]:
    """The tensors of a (nested) tuple / list of outputs, in order: what an exported graph returns."""
    if isinstance(out, torch.Tensor):
        return (out, )
    flat = []
    for o in out:
        flat.extend(flatten_outputs(o))
    return tuple(flat)


class _IntScaleUpsample(nn.Module):
    """mmseg's ``Upsample(scale_factor=k)`` for an integer ``k``, with the output size computed as ``k * size``.

    mmseg computes ``int(size * float(k))``: a float of a symbolic size, which torch.export specialises to the
    example's value (so the exported model silently resizes to the example's size). Same output in eager.
    """

    def __init__(self, factors: tuple[int, int], mode: str, align_corners):
        super().__init__()
        self.factors, self.mode, self.align_corners = factors, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[-2] * self.factors[0], x.shape[-1] * self.factors[1])
        return F.interpolate(x, size=size, mode=self.mode, align_corners=self.align_corners)


def adaptive_pool_matrix(n, s: int, like: torch.Tensor) -> torch.Tensor:
    """``(s, n)`` averaging matrix of ``adaptive_avg_pool1d`` from ``n`` to ``s`` positions.

    Row ``i`` averages positions ``floor(i n / s) <= j < ceil((i + 1) n / s)`` (PyTorch's definition);
    ``n`` may be a symbolic size, so the matrix is computed inside a captured graph.
    """
    i = torch.arange(s, device=like.device)
    j = torch.arange(n, device=like.device)
    start = torch.div(i * n, s, rounding_mode='floor')
    end = torch.div((i + 1) * n + s - 1, s, rounding_mode='floor')
    inside = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
    return inside.to(like.dtype) / (end - start).to(like.dtype)[:, None]


class _MatrixAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d(output_size)`` as two matrix products, ``P_h @ x @ P_w^T``.

    ``x (B, C, H, W) -> (B, C, s_h, s_w)``. The exporters decompose adaptive pooling with gather indices computed
    from the example's size (onnxruntime then fails or reads wrong positions at other sizes); the averaging
    matrices here are built from the input's symbolic size. Equal to PyTorch's up to summation order.
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, ) * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh, sw = self.output_size
        if sh is not None:
            x = torch.matmul(adaptive_pool_matrix(x.shape[-2], sh, x), x)
        if sw is not None:
            x = torch.matmul(x, adaptive_pool_matrix(x.shape[-1], sw, x).transpose(0, 1))
        return x


def make_exportable(module: nn.Module) -> nn.Module:
    """Replace, in place, submodules whose forward bakes the example size into a captured graph; returns module.

    Today: mmseg ``Upsample`` with an integer ``scale_factor`` (Semantic FPN's scale heads; non-integer factors
    raise, naming the module) and ``nn.AdaptiveAvgPool2d`` (UperNet's pyramid pooling).
    """
    for name, child in list(module.named_children()):
        if type(child) is nn.AdaptiveAvgPool2d:
            setattr(module, name, _MatrixAdaptiveAvgPool2d(child.output_size))
            continue
        if type(child).__name__ == 'Upsample' and type(child).__module__.startswith('mmseg') and not child.size:
            f = child.scale_factor
            factors = tuple(f) if isinstance(f, (tuple, list)) else (f, f)
            if any(float(v) != int(v) for v in factors):
                raise ValueError(f'{name}: mmseg Upsample with scale_factor={f} cannot be exported with dynamic sizes '
                                 '(the output size would be baked in); use an integer factor')
            setattr(module, name, _IntScaleUpsample(tuple(int(v) for v in factors), child.mode, child.align_corners))
        else:
            make_exportable(child)
    return module


class ExportPart(nn.Module):
    """``image (B, C, H, W) -> tuple of tensors`` for one part of a detector or segmentor (see module doc).

    Args:
        model (nn.Module): an mmdet detector, an mmseg segmentor, or a bare backbone (then only ``'backbone'``).
        part (str): ``'backbone' | 'backbone+neck' | 'model'``.
    """

    def __init__(self, model: nn.Module, part: str = 'backbone'):
        super().__init__()
        if part not in PARTS:
            raise ValueError(f'part must be one of {PARTS}, got {part!r}')
        self.part = part
        make_exportable(model)
        self.backbone = getattr(model, 'backbone', model)
        self.neck = getattr(model, 'neck', None) if getattr(model, 'with_neck', False) else None
        self.head = None
        if part == 'backbone+neck' and self.neck is None:
            raise ValueError(f"part 'backbone+neck': {type(model).__name__} has no neck; use --part backbone")
        if part == 'model':
            if hasattr(model, 'decode_head'):  # mmseg EncoderDecoder
                self.head = model.decode_head
                self.kind = 'segmentor'
            elif hasattr(model, 'bbox_head') and not hasattr(model, 'roi_head'):  # mmdet single-stage
                self.head = model.bbox_head
                self.kind = 'dense_detector'
            else:
                raise ValueError(
                    f"part 'model' is not exportable for {type(model).__name__}: its predictions need NMS / RoIAlign "
                    "custom ops. Use mmdeploy's onnxruntime pipeline (tools/export_mmdeploy.py) or "
                    "--part backbone+neck")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feats = self.backbone(x)
        if self.part == 'backbone':
            return tuple(feats)
        if self.neck is not None:
            feats = self.neck(feats)
        if self.part == 'backbone+neck':
            return tuple(feats)
        if self.kind == 'segmentor':
            logits = self.head(feats)
            return (F.interpolate(logits, size=x.shape[2:], mode='bilinear', align_corners=self.head.align_corners), )
        return flatten_outputs(self.head(feats))
