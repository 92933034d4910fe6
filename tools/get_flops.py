"""Parameters and GMACs of the plugin's backbones (every registered family and arch, or one family).

    python tools/get_flops.py [--family NAME|all] [--sizes 224x224 800x1333]

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.models.backbones.base import FAMILIES
    p.add_argument('--family', choices=[*FAMILIES, 'all'], default='all')
    p.add_argument('--sizes', nargs='+', default=['224x224', '800x1333'])
    args = p.parse_args(argv)
    sizes = [parse_size(s, p) for s in args.sizes]
    families = list(FAMILIES) if args.family == 'all' else [args.family]
    header = f'{"model":24s} {"params":>12s}' + ''.join(f' {f"GMACs@{h}x{w}":>16s}' for h, w in sizes)
    print(header)
    rows = []
    for fam in families:
        for arch in FAMILIES[fam].arch_names():
            macs = []
            for size in sizes:
                params, m = complexity(fam, arch, size)
                macs.append(m)
            rows.append((f'{fam}-{arch}', params, macs))
            print(f'{fam + "-" + arch:24s} {params:12,d}' + ''.join(f' {m:16.2f}' for m in macs), flush=True)
    return rows


if __name__ == '__main__':
    main()
