"""Convert an official / timm / OpenMMLab SwiftFormer or Swin checkpoint to the plugin's format.

    python tools/convert_checkpoint.py SRC DST [--family swiftformer|swin|swinv2] [--window-size 12]
        [--out-indices 0 1 2 3]

The conversion is the same pure function the backbones apply to ``init_cfg=dict(type='Pretrained', ...)`` (so
this step is optional); it is handy to inspect what a file contains, to resize Swin V1 bias tables once, or to ship
a converted file. The input is read with weights-only semantics; the output ``{'state_dict': ..., 'meta': ...}``
is written atomically. Dropped keys (classifier heads, derived buffers) are printed.
"""
from __future__ import annotations

import argparse
import io
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))


def detect_family(sd) -> str:
    if any(k.startswith(('network.', 'stem.')) for k in sd):
        return 'swiftformer'
    if any(k.endswith('relative_position_bias_table') for k in sd):
        return 'swin'
    if any('cpb_mlp' in k for k in sd):
        return 'swinv2'
    raise SystemExit('error: cannot tell the model family from the keys; pass --family')


def convert(src: str, dst: str, family: str | None = None, window_size=None, out_indices=(0, 1, 2, 3)) -> dict:
    import torch

    from mmplugin.checkpoint import atomic_write_bytes, load_checkpoint_file
    from mmplugin.converters import convert_swiftformer, convert_swin, unwrap_state_dict
    sd = unwrap_state_dict(load_checkpoint_file(src))
    family = family or detect_family(sd)
    if family == 'swiftformer':
        out, dropped = convert_swiftformer(sd, out_indices=out_indices)
    else:
        windows = None if window_size is None else [window_size] * 4
        out, dropped = convert_swin(sd, version=2 if family == 'swinv2' else 1, window_sizes=windows,
                                    out_indices=out_indices)
    buf = io.BytesIO()
    torch.save({'state_dict': out, 'meta': {'converted_from': osp.basename(src), 'family': family,
                                            'dropped': dropped}}, buf)
    atomic_write_bytes(buf.getvalue(), dst)
    print(f'{family}: wrote {len(out)} tensors to {dst}')
    print(f'dropped ({len(dropped)}): {", ".join(dropped) if dropped else "none"}')
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('src')
    p.add_argument('dst')
    p.add_argument('--family', choices=['swiftformer', 'swin', 'swinv2'], default=None, help='default: detect')
    p.add_argument('--window-size', type=int, default=None, help='Swin V1: resize bias tables to this window')
    p.add_argument('--out-indices', type=int, nargs='+', default=[0, 1, 2, 3])
    args = p.parse_args(argv)
    from mmplugin.checkpoint import CheckpointError
    try:
        convert(args.src, args.dst, args.family, args.window_size, tuple(args.out_indices))
    except (CheckpointError, FileNotFoundError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
