"""The SwiftFormer paper's Table 3 (arXiv 2303.15446: Mask R-CNN on COCO, Semantic FPN on ADE20K), measured here.

For each of its eight backbones: parameters, GMACs at 1333x800 and 512x512, and CPU latency of the backbone and of
the whole model (Mask R-CNN at 1333x800, Semantic FPN at 512x512, random weights, eval mode, batch 1), all timed
side by side in one process (:func:`mmplugin.utils.timing.interleaved`), as ratios to SwiftFormer-L1, beside the
paper's accuracy. The models are the plugin's configs (``configs/swiftformer_l{1,3}_*`` and
``configs/comparison/``), so what is timed is what trains. :func:`plot` draws accuracy against measured latency.
"""
from __future__ import annotations

import os.path as osp
import warnings
from dataclasses import dataclass

import torch

__all__ = ['ROWS', 'Row', 'measure', 'format_table', 'plot']


@dataclass(frozen=True)
class Row:
    name: str
    det_config: str
    seg_config: str
    box_ap: float
    mask_ap: float
    miou: float


_C = 'configs/comparison/'
#: Table 3 of arXiv 2303.15446 in its order: box AP, mask AP (COCO val, Mask R-CNN 1x), mIoU (ADE20K, Semantic FPN)
ROWS = (
    Row('ResNet-18', _C + 'resnet18_maskrcnn_1x_coco.py', _C + 'resnet18_semfpn_40k_ade20k.py', 34.0, 31.2, 32.9),
    Row('PoolFormer-S12', _C + 'poolformer_s12_maskrcnn_1x_coco.py', _C + 'poolformer_s12_semfpn_40k_ade20k.py',
        37.3, 34.6, 37.2),
    Row('EfficientFormer-L1', _C + 'efficientformer_l1_maskrcnn_1x_coco.py',
        _C + 'efficientformer_l1_semfpn_40k_ade20k.py', 37.9, 35.4, 38.9),
    Row('SwiftFormer-L1', 'configs/swiftformer/swiftformer_l1_maskrcnn_1x_coco.py',
        'configs/swiftformer/swiftformer_l1_semfpn_40k_ade20k.py',
        41.2, 38.1, 41.4),
    Row('ResNet-50', _C + 'resnet50_maskrcnn_1x_coco.py', _C + 'resnet50_semfpn_40k_ade20k.py', 38.0, 34.4, 36.7),
    Row('PoolFormer-S24', _C + 'poolformer_s24_maskrcnn_1x_coco.py', _C + 'poolformer_s24_semfpn_40k_ade20k.py',
        40.1, 37.0, 40.3),
    Row('EfficientFormer-L3', _C + 'efficientformer_l3_maskrcnn_1x_coco.py',
        _C + 'efficientformer_l3_semfpn_40k_ade20k.py', 41.4, 38.1, 43.5),
    Row('SwiftFormer-L3', 'configs/swiftformer/swiftformer_l3_maskrcnn_1x_coco.py',
        'configs/swiftformer/swiftformer_l3_semfpn_40k_ade20k.py',
        42.7, 39.1, 43.9),
)
BASELINE = 'SwiftFormer-L1'
DET_SIZE, SEG_SIZE = (800, 1333), (512, 512)  # (H, W)


def _build(config: str, root: str):
    """The config's model, random weights (no download), eval mode, SyncBN reverted."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm

    import mmplugin  # noqa: F401  (mmplugin:: bases)
    cfg = Config.fromfile(osp.join(root, config))
    cfg.model.backbone.init_cfg = None
    if 'semfpn' in config:
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    torch.manual_seed(0)
    model = revert_sync_batchnorm(MODELS.build(cfg.model))
    model.init_weights()
    return model.eval()


def _predict(model, size):
    """One whole-model inference on a random ``size`` image through the model's own preprocessing and heads."""
    h, w = size
    if hasattr(model, 'decode_head'):
        from mmseg.structures import SegDataSample
        samples = [SegDataSample(metainfo=dict(img_shape=size, ori_shape=size, pad_shape=size))]
    else:
        from mmdet.structures import DetDataSample
        samples = [DetDataSample(metainfo=dict(img_shape=size, ori_shape=size, pad_shape=size, scale_factor=(1., 1.),
                                               batch_input_shape=size, img_id=0))]
    img = torch.randint(0, 255, (3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    data = dict(inputs=[img], data_samples=samples)

    def run():
        with torch.no_grad():
            return model.test_step(data)
    return run


def _macs(module, x) -> float:
    from mmplugin.analysis.complexity import flop_analyzer
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter('ignore')
        return flop_analyzer(module, x).total() / 1e9


def measure(rows=ROWS, rounds: int = 3, root: str = '.', whole: bool = True) -> list[dict]:
    """One dict per row: ``name, params_m, gmacs_det, gmacs_seg, backbone_ms_det, backbone_ms_seg, det_ms, seg_ms``
    (medians of ``rounds`` interleaved rounds; ``det_ms`` / ``seg_ms`` None with ``whole=False``), the ratios of
    each time to the baseline's (``*_x``: baseline time / time, so > 1 is faster than SwiftFormer-L1) and the
    paper's accuracy."""
    from mmplugin.utils.timing import interleaved
    xd, xs = torch.randn(1, 3, *DET_SIZE), torch.randn(1, 3, *SEG_SIZE)
    out, fns = [], {}
    for r in rows:
        det, seg = _build(r.det_config, root), _build(r.seg_config, root)
        bb = det.backbone
        info = dict(name=r.name, box_ap=r.box_ap, mask_ap=r.mask_ap, miou=r.miou,
                    params_m=sum(p.numel() for p in bb.parameters()) / 1e6,
                    gmacs_det=_macs(bb, xd), gmacs_seg=_macs(bb, xs))
        out.append(info)

        def backbone(x, m=bb):
            def run():
                with torch.no_grad():
                    return m(x)
            return run
        fns[(r.name, 'backbone_ms_det')] = backbone(xd)
        fns[(r.name, 'backbone_ms_seg')] = backbone(xs, seg.backbone)
        if whole:
            fns[(r.name, 'det_ms')] = _predict(det, DET_SIZE)
            fns[(r.name, 'seg_ms')] = _predict(seg, SEG_SIZE)
    times = interleaved(fns, rounds)
    for info in out:
        for key in ('backbone_ms_det', 'backbone_ms_seg', 'det_ms', 'seg_ms'):
            t = times.get((info['name'], key))
            info[key] = None if t is None else t * 1e3
    base = next((i for i in out if i['name'] == BASELINE), None)
    ratio = {'backbone_ms_det': 'backbone_det_x', 'backbone_ms_seg': 'backbone_seg_x', 'det_ms': 'det_x',
             'seg_ms': 'seg_x'}
    for info in out:
        for key, rkey in ratio.items():
            b = base and base[key]
            info[rkey] = None if not b or info[key] is None else b / info[key]
    return out


def format_table(rows: list[dict]) -> str:
    """Markdown table of :func:`measure`'s rows."""
    def f(v, fmt):
        return '-' if v is None else format(v, fmt)
    head = ('| backbone | params (M) | GMACs 1333x800 | GMACs 512x512 | backbone ms 1333x800 (x) '
            '| backbone ms 512x512 (x) | Mask R-CNN ms (x) | Semantic FPN ms (x) | paper box AP / mask AP '
            '| paper mIoU |')
    lines = [head, '|' + '---|' * 10]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['params_m']:.1f} | {r['gmacs_det']:.1f} | {r['gmacs_seg']:.1f} "
            f"| {f(r['backbone_ms_det'], '.0f')} ({f(r['backbone_det_x'], '.2f')}) "
            f"| {f(r['backbone_ms_seg'], '.0f')} ({f(r['backbone_seg_x'], '.2f')}) "
            f"| {f(r['det_ms'], '.0f')} ({f(r['det_x'], '.2f')}) | {f(r['seg_ms'], '.0f')} ({f(r['seg_x'], '.2f')}) "
            f"| {r['box_ap']} / {r['mask_ap']} | {r['miou']} |")
    return '\n'.join(lines)


def plot(rows: list[dict], out: str, title: str = '') -> str:
    """Paper accuracy against measured whole-model latency, one point per row: box AP vs Mask R-CNN ms (left),
    mIoU vs Semantic FPN ms (right). Writes ``out`` (PNG) and returns it."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (tkey, akey, label) in zip(axes, (('det_ms', 'box_ap', 'COCO box AP (Mask R-CNN 1x, 1333x800)'),
                                              ('seg_ms', 'miou', 'ADE20K mIoU (Semantic FPN, 512x512)'))):
        for r in rows:
            t = r[tkey] if r[tkey] is not None else r['backbone_ms_' + ('det' if tkey == 'det_ms' else 'seg')]
            swift = r['name'].startswith('SwiftFormer')
            ax.scatter(t, r[akey], s=60 if swift else 36, marker='*' if swift else 'o',
                       color='tab:red' if swift else 'tab:blue')
            ax.annotate(r['name'], (t, r[akey]), textcoords='offset points', xytext=(5, 4), fontsize=8)
        ax.set_xlabel('measured CPU latency, ms (batch 1)')
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
