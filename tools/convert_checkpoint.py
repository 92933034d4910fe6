"""Convert an official / timm / OpenMMLab backbone checkpoint (any registered family) to the plugin's format.

    python tools/convert_checkpoint.py SRC DST [--family NAME] [--window-size 12]
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


def convert(src: str, dst: str, family: str | None = None, window_size=None, out_indices=(0, 1, 2, 3)) -> dict:
    """Read ``src`` (weights-only), convert it with its family's converter, write ``dst`` atomically."""
    import torch

    from mmplugin.checkpoint import atomic_write_bytes, load_checkpoint_file
    from mmplugin.converters import unwrap_state_dict
    from mmplugin.models.backbones.base import detect_family, get_family
    sd = unwrap_state_dict(load_checkpoint_file(src))
    cls = get_family(family) if family else detect_family(sd)
    options = {}
    if window_size is not None:
        if 'window_sizes' not in cls.converter_options():
            raise ValueError(f'--window-size does not apply to the {cls.family} family')
        options['window_sizes'] = [window_size] * cls.num_stages
    out, dropped = cls.convert(sd, out_indices=out_indices, **options)
    buf = io.BytesIO()
    torch.save({'state_dict': out, 'meta': {'converted_from': osp.basename(src), 'family': cls.family,
                                            'dropped': dropped}}, buf)
    atomic_write_bytes(buf.getvalue(), dst)
    print(f'{cls.family}: wrote {len(out)} tensors to {dst}')
    print(f'dropped ({len(dropped)}): {", ".join(dropped) if dropped else "none"}')
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('src')
    p.add_argument('dst')
    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.models.backbones.base import FAMILIES
    p.add_argument('--family', choices=list(FAMILIES), default=None, help='default: detect from the keys')
    p.add_argument('--window-size', type=int, default=None,
                   help='families with window attention: resize / regenerate position tables for this window')
    p.add_argument('--out-indices', type=int, nargs='+', default=[0, 1, 2, 3])
    args = p.parse_args(argv)
    from mmplugin.checkpoint import CheckpointError
    try:
        convert(args.src, args.dst, args.family, args.window_size, tuple(args.out_indices))
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
