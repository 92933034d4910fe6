"""Parameters and GMACs of the plugin's backbones (every registered family and arch, or one family), or of whole
models built from configs.

    python tools/get_flops.py [--family NAME|all] [--sizes 224 800x1333]
    python tools/get_flops.py --config configs/swin/swin_l_htcpp_6x_coco.py [...] [--shape 1280 800] [--proposals 1000]

Progress goes to stderr, one line per model with its elapsed time (every arch is traced at every size). Counts
multiply-accumulates (:mod:`mmplugin.analysis.complexity`) with mmengine's jit-trace FlopAnalyzer (one MAC per fused
multiply-add, the convention of the SwiftFormer and Swin papers), plus a handler for
``scaled_dot_product_attention``. Backbone only: the paper's SwiftFormer figures (Table 4: 0.6 / 1.0 / 1.6 / 4.0
GMACs at 224x224) include the classifier, whose pooling and 1000-way linear add < 0.001 GMACs. Parameters include the
four output norms."""
from __future__ import annotations

import argparse
import os.path as osp
import sys
import time

from mmplugin.analysis import backbone_complexity, model_complexity, parse_hw
from mmplugin.cli.common import run_tool, tool_main


def parse_size(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """``'224'`` (square) or ``'800x1333'`` (height x width) -> ``(h, w)``; a usage error otherwise."""
    try:
        return parse_hw(text)
    except ValueError as err:
        parser.error(f'--sizes: {err}')


def main_models(args) -> list[dict]:
    width, height = args.shape
    rows = []
    for i, config in enumerate(args.config, 1):
        t = time.perf_counter()
        res = model_complexity(config, (width, height), args.proposals, args.mask_rois)
        _progress(i, len(args.config), osp.basename(config), t)
        parts = ', '.join(f'{k} {v / 1e9:.1f}' for k, v in res['modules'].items())
        print(f'{osp.basename(config)}: {res["params"]:,d} params ({res["params"] / 1e6:.1f}M), '
              f'{res["macs"] / 1e9:.1f} GMACs at {width}x{height}, of which attention products '
              f'{res["attention_macs"] / 1e9:.1f} ({parts})', flush=True)
        rows.append(dict(config=config, **res))
    return rows


def _progress(i: int, n: int, name: str, start: float) -> None:
    print(f'[{i}/{n}] {name}: {time.perf_counter() - start:.1f} s', file=sys.stderr, flush=True)


@tool_main
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
    todo = [(fam, arch) for fam in families for arch in args.arch or FAMILIES[fam].arch_names()]
    for i, (fam, arch) in enumerate(todo, 1):
        t = time.perf_counter()
        macs = []
        for size in sizes:
            params, m = backbone_complexity(fam, arch, size)
            macs.append(m)
        _progress(i, len(todo), f'{fam}-{arch}', t)
        rows.append((f'{fam}-{arch}', params, macs))
        print(f'{fam + "-" + arch:24s} {params:12,d}' + ''.join(f' {m:16.2f}' for m in macs), flush=True)
    return rows


if __name__ == '__main__':
    run_tool(main)
