"""A whole detector's training step as the plugin's config builds it against the same detector as mmdet's own config
builds it (mmdet's ``SwinTransformer``, mmcv's ``RoIAlign``): the same weights everywhere (the backbone's converted,
neck and heads copied), the same synthetic batch and the same anchor / RoI sampling, so the two differ only in the
backbone's code and, where the config names :class:`mmplugin.ops.RoIAlign`, in the RoI layer's kernel. A third
timing, the plugin's backbone with mmcv's ``RoIAlign`` (:data:`BACKBONE_ONLY`), separates the two.

Why: the backbone is only part of a Mask R-CNN step (the FPN, RPN, RoI heads and the mask head run the same code in
both), so the whole step's ratio is what a user training a detector sees. Timed interleaved in one process
(:func:`detector_training_rows`); peak memory of one step of each in a fresh process (``python -m
mmplugin.analysis.detector_step CONFIG NAME HxW BATCH`` prints a JSON line; NAME one of :data:`NAMES`).
"""
from __future__ import annotations

import copy
import json
import sys

import numpy as np
import torch
from torch import nn

__all__ = ['NAMES', 'BACKBONE_ONLY', 'detector_pair', 'synthetic_batch', 'training_step', 'detector_training_rows',
           'measure_step_peak', 'step_peak_memory']

NAMES = ('mmdet-swin', 'mmplugin', 'mmplugin with_cp')
BACKBONE_ONLY = 'mmplugin backbone, mmcv RoIAlign'


_SAME_AS_MMDET = dict(frozen_stages=-1, norm_eval=False, qk_scale=None)  # settings mmdet's peer is built with


def detector_pair(config: str, with_cp: bool = False, only: str | None = None) -> dict[str, nn.Module]:
    """``{'mmdet-swin': detector, 'mmplugin': detector}`` built from ``config`` (a plugin Swin V1 detector config)
    with random weights, in train mode; ``only`` (one of those names) builds just that one. mmdet's gets mmdet's
    ``SwinTransformer`` and mmcv's ``RoIAlign`` in place of any :class:`mmplugin.ops.RoIAlign`. Drop path and dropout
    are 0 in both (random masks would make the two steps different functions); ``with_cp`` sets the plugin
    backbone's activation checkpointing.

    Raises:
        ConfigValueError: the config's model is not an mmdet detector with ``mmplugin.SwinTransformer``, or sets a
            backbone option mmdet's peer would not get (frozen stages, ``norm_eval``, ``qk_scale``).
    """
    from mmplugin.analysis.peers import swin_peers
    from mmplugin.apis import build_model, load_config
    from mmplugin.models.roi_extractors import use_mmcv_roi_align
    from mmplugin.utils.errors import ConfigValueError
    cfg = load_config(config)
    backbone = cfg.model.backbone
    if str(backbone.get('type')) != 'mmplugin.SwinTransformer' or cfg.get('default_scope', 'mmdet') != 'mmdet':
        raise ConfigValueError(f"{config}: the detector training step needs an mmdet detector with "
                               f"type='mmplugin.SwinTransformer' (Swin V1), got backbone {backbone.get('type')!r}")
    odd = {k: backbone[k] for k, v in _SAME_AS_MMDET.items() if backbone.get(k, v) != v}
    if odd:
        raise ConfigValueError(f'{config}: backbone options {odd} are not passed to mmdet\'s SwinTransformer peer')
    backbone.pop('init_cfg', None)  # no pretrained file: random weights
    backbone.update(drop_path_rate=0.0, drop_rate=0.0, attn_drop_rate=0.0, with_cp=with_cp)
    torch.manual_seed(0)
    ours = build_model(cfg)
    if only == 'mmplugin':
        return {'mmplugin': ours.train()}
    theirs = ours if only == 'mmdet-swin' else copy.deepcopy(ours)
    theirs.backbone = swin_peers('', ours.backbone)['mmdet-swin']
    use_mmcv_roi_align(theirs)
    return {'mmdet-swin': theirs.train()} if only else {'mmdet-swin': theirs.train(), 'mmplugin': ours.train()}


def synthetic_batch(size: tuple[int, int], batch: int = 2, num_classes: int = 80, objects: int = 4, seed: int = 0):
    """``(inputs, data_samples)`` for ``model.loss``: normalised random images ``(batch, 3, H, W)`` and per image
    ``objects`` boxes with rectangular masks inside them and random labels."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    h, w = size
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch, 3, h, w, generator=g)
    samples = []
    for _ in range(batch):
        wh = torch.rand(objects, 2, generator=g) * 0.4 + 0.1  # 10-50% of the side
        xy = torch.rand(objects, 2, generator=g) * (1 - wh)
        boxes = torch.cat((xy, xy + wh), 1) * torch.tensor([w, h, w, h], dtype=torch.float32)
        masks = np.zeros((objects, h, w), dtype=np.uint8)
        for i, (x0, y0, x1, y1) in enumerate(boxes.round().long().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
                                             batch_input_shape=(h, w), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.randint(num_classes, (objects, ), generator=g),
                                           masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    return inputs, samples


def training_step(model: nn.Module, opt: torch.optim.Optimizer, inputs, samples) -> dict[str, float]:
    """One step: losses -> backward -> optimizer step; returns the losses. The sampling RNG is reseeded first, so two
    detectors of the same function sample the same anchors and RoIs."""
    torch.manual_seed(1)
    opt.zero_grad(set_to_none=True)
    loss, log_vars = model.parse_losses(model.loss(inputs, samples))
    loss.backward()
    opt.step()
    return {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}


def _num_classes(model: nn.Module) -> int:
    """Classes of the detector's box head (the first stage's for a cascade), for the synthetic labels."""
    head = getattr(getattr(model, 'roi_head', None), 'bbox_head', None)
    head = head[0] if isinstance(head, nn.ModuleList) else head
    return int(getattr(head, 'num_classes', None) or getattr(model.bbox_head, 'num_classes', 80))


def detector_training_rows(config: str, size=(512, 768), rounds: int = 3, batch: int = 2,
                           memory: bool = True) -> list[dict]:
    """Interleaved training steps (AdamW, fp32) of :func:`detector_pair`, and, with ``memory``, the peak RSS growth
    of one step of mmdet's, the plugin's and the plugin's with activation checkpointing, each in a fresh process.
    Where the config uses :class:`mmplugin.ops.RoIAlign`, the plugin's detector with mmcv's ``RoIAlign``
    (:data:`BACKBONE_ONLY`) is timed in the same rounds: what the backbone alone gains.

    Returns one dict per implementation: ``seconds`` (median step), ``ratio`` (speed over mmdet's), ``losses`` (the
    first step's, which equal mmdet's up to fp32 rounding where the sampling agrees), ``peak_mib``, ``mem_ratio``
    (over mmdet's; None without ``memory``).
    """
    from mmplugin.models.roi_extractors import use_mmcv_roi_align
    from mmplugin.utils.timing import interleaved
    models = detector_pair(config)
    backbone_only = copy.deepcopy(models['mmplugin'])
    if use_mmcv_roi_align(backbone_only):
        models[BACKBONE_ONLY] = backbone_only
    inputs, samples = synthetic_batch(size, batch, _num_classes(models['mmplugin']))
    fns, first = {}, {}
    for name, m in models.items():
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        first[name] = training_step(m, opt, inputs, samples)  # the same step from the same weights in all
        fns[name] = lambda m=m, opt=opt: training_step(m, opt, inputs, samples)
    times = interleaved(fns, rounds)
    del models, fns, backbone_only  # the detectors and their optimizer states are not held while the children run
    peaks = {name: step_peak_memory(config, name, size, batch) for name in NAMES} if memory else {}
    base = times['mmdet-swin']
    rows = []
    for name in (NAMES[0], BACKBONE_ONLY, *NAMES[1:]):
        if name not in times and name not in peaks:
            continue
        sec = times.get(name)
        mib = peaks.get(name)
        rows.append(dict(config=config, size=list(size), batch=batch, impl=name, seconds=sec,
                         ratio=base / sec if sec else None, losses=first.get(name), peak_mib=mib,
                         mem_ratio=mib / peaks['mmdet-swin'] if mib is not None else None))
    return rows


def measure_step_peak(config: str, name: str, size: tuple[int, int], batch: int) -> float:
    """In this process: the growth of the RSS high-water mark over one training step of ``name`` (MiB, Linux),
    the lazily allocated AdamW state included."""
    from mmplugin.analysis.memory import rss_growth_mib
    base_name = name.split(' ')[0]
    model = detector_pair(config, with_cp=name.endswith('with_cp'), only=base_name)[base_name]
    inputs, samples = synthetic_batch(size, batch, _num_classes(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return rss_growth_mib(lambda: training_step(model, opt, inputs, samples))


def step_peak_memory(config: str, name: str, size: tuple[int, int], batch: int = 2, timeout: float = 1800) -> float:
    """:func:`measure_step_peak` in a fresh subprocess (MiB)."""
    if name not in NAMES:
        raise ValueError(f'name must be one of {NAMES}, got {name!r}')
    from mmplugin.analysis.memory import peak_in_subprocess
    return peak_in_subprocess('mmplugin.analysis.detector_step', [config, name, f'{size[0]}x{size[1]}', str(batch)],
                              timeout)


if __name__ == '__main__':
    _config, _name, _size, _batch = sys.argv[1:5]
    import mmplugin  # noqa: F401  (registers the backbones)
    from mmplugin.analysis.timing import parse_hw
    print(json.dumps({'peak_mib': measure_step_peak(_config, _name, parse_hw(_size), int(_batch))}))
