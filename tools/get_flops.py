"""Parameters and GMACs of the plugin's backbones (every registered family and arch, or one family), or of whole
models built from configs.

    python tools/get_flops.py [--family NAME|all] [--sizes 224 800x1333]
    python tools/get_flops.py --config configs/swin_l_htcpp_6x.py [...] [--shape 1280 800] [--proposals 1000]

Counts multiply-accumulates with mmengine's jit-trace FlopAnalyzer (one MAC per fused multiply-add, the
convention of the SwiftFormer and Swin papers), plus a handler for ``scaled_dot_product_attention``. Backbone only:
the paper's SwiftFormer figures (Table 4: 0.6 / 1.0 / 1.6 / 4.0 GMACs at 224x224) include the classifier, whose
pooling and 1000-way linear add < 0.001 GMACs. Parameters include the four output norms.
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys
import warnings

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))

def _sdpa_handle(inputs, outputs):
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(x) for x in inputs[:3])
    *batch, n, d = q
    m, dv = k[-2], v[-1]
    count = 1
    for b in batch:
        count *= b
    return count * n * m * (d + dv)  # q k^T and attn v


def complexity(family: str, arch: str, size) -> tuple[int, float]:
    import torch
    from mmengine.analysis import FlopAnalyzer

    from mmplugin.models.backbones.base import get_family
    model = get_family(family)(arch).eval()
    params = sum(p.numel() for p in model.parameters())
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter('ignore')
        fa = FlopAnalyzer(model, (torch.zeros(1, 3, *size), ))
        fa.set_op_handle('aten::scaled_dot_product_attention', _sdpa_handle)
        fa.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        macs = fa.total() / 1e9
    return params, macs


def parse_size(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """``'224'`` (square) or ``'800x1333'`` (height x width) -> ``(h, w)``; a usage error otherwise."""
    parts = text.lower().split('x')
    if len(parts) in (1, 2) and all(v.strip().isdigit() and int(v) > 0 for v in parts):
        return (int(parts[0]), int(parts[-1]))
    parser.error(f'--sizes: {text!r} is not a size; write 224 (square) or 800x1333 (height x width)')


# ------------------------------------------------------------------------------------------------ whole models
def _fixed_proposals(num: int, width: int, height: int):
    """``(num, 4)`` boxes spread over the image (fixed seed): the RoI heads' cost depends on how many, not where."""
    import torch
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(num, 2, generator=g) * torch.tensor([width * 0.75, height * 0.75])
    wh = (0.05 + torch.rand(num, 2, generator=g) * 0.2) * torch.tensor([width, height])
    return torch.cat([xy, xy + wh], dim=1)


def _flat(*outputs) -> tuple:
    """Nested tuples / lists / dicts of tensors -> one flat tuple (what jit tracing accepts as outputs)."""
    import torch
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
    from torch import nn

    class WholeModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, img):
            if getattr(model, 'with_rpn', False) and getattr(model, 'with_roi_head', False):
                from mmengine.structures import InstanceData

                from mmdet.structures import DetDataSample
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
        config: config file; the backbone's ``init_cfg`` is dropped (nothing is downloaded or loaded).
        shape: ``(width, height)`` of the input, e.g. the Swin paper's detection FLOPs at 1280x800.
        num_proposals, num_mask_rois: RoIs of the box and the mask heads (two-stage detectors only).

    Returns:
        ``dict(params, macs, attention_macs, modules)``: ``macs`` counts every matrix product, the attention
        products ``q k^T`` and ``attn v`` included; ``attention_macs`` is their part (mmcv 1.x's module-hook
        counter, which mmdet 2.x's get_flops used, leaves them out); ``modules`` splits ``macs`` by the model's
        top-level children (each neck of a list of necks separately).
    """
    import torch
    from mmengine.analysis import FlopAnalyzer
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm

    import mmplugin  # noqa: F401  (registers the plugin's models)
    cfg = Config.fromfile(config)
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
        fa = FlopAnalyzer(_whole_model_forward(model, width, height, num_rois), (torch.zeros(1, 3, height, width), ))
        fa.set_op_handle('aten::scaled_dot_product_attention', _sdpa_handle)
        fa.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
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


def main_models(args) -> list[dict]:
    width, height = args.shape
    rows = []
    for config in args.config:
        res = model_complexity(config, (width, height), args.proposals, args.mask_rois)
        parts = ', '.join(f'{k} {v / 1e9:.1f}' for k, v in res['modules'].items())
        print(f'{osp.basename(config)}: {res["params"]:,d} params ({res["params"] / 1e6:.1f}M), '
              f'{res["macs"] / 1e9:.1f} GMACs at {width}x{height}, of which attention products '
              f'{res["attention_macs"] / 1e9:.1f} ({parts})', flush=True)
        rows.append(dict(config=config, **res))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.models.backbones.base import FAMILIES
    p.add_argument('--family', choices=[*FAMILIES, 'all'], default='all')
    p.add_argument('--arch', nargs='+', default=None, help='only these archs of the family (default: all)')
    p.add_argument('--sizes', nargs='+', default=['224x224', '800x1333'])
    p.add_argument('--config', nargs='+', help='whole-model mode: count the full model of these configs instead')
    p.add_argument('--shape', nargs=2, type=int, default=[1280, 800], metavar=('WIDTH', 'HEIGHT'),
                   help='whole-model input size (default 1280 800, the Swin paper\'s detection FLOPs)')
    p.add_argument('--proposals', type=int, default=1000, help='whole-model mode: RoIs of the box heads of '
                   'two-stage detectors (mmdet 2.x get_flops: 1000)')
    p.add_argument('--mask-rois', type=int, default=100, help='whole-model mode: RoIs of the mask heads '
                   '(mmdet 2.x get_flops: the first 100)')
    args = p.parse_args(argv)
    if args.config:
        return main_models(args)
    sizes = [parse_size(s, p) for s in args.sizes]
    families = list(FAMILIES) if args.family == 'all' else [args.family]
    header = f'{"model":24s} {"params":>12s}' + ''.join(f' {f"GMACs@{h}x{w}":>16s}' for h, w in sizes)
    print(header)
    rows = []
    for fam in families:
        for arch in args.arch or FAMILIES[fam].arch_names():
            macs = []
            for size in sizes:
                params, m = complexity(fam, arch, size)
                macs.append(m)
            rows.append((f'{fam}-{arch}', params, macs))
            print(f'{fam + "-" + arch:24s} {params:12,d}' + ''.join(f' {m:16.2f}' for m in macs), flush=True)
    return rows


if __name__ == '__main__':
    main()
