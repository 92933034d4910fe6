"""Convert an official / timm / OpenMMLab backbone checkpoint (any registered family) to the plugin's format, or a
whole-model (detector / segmentor) checkpoint to the model of a config.

    python tools/convert_checkpoint.py SRC DST [--family NAME] [--window-size 12]
        [--out-indices 0 1 2 3]
    python tools/convert_checkpoint.py SRC DST --config CONFIG [--cfg-options ...]

With ``--config``, SRC is a whole detector / segmentor checkpoint in any published layout (official Swin detection /
segmentation repositories, mmdet / mmseg model zoos, the plugin's own): its backbone part is converted by the
family's converter, everything else must already match key for key and shape for shape, and DST loads *strictly*
(``model.load_state_dict(..., strict=True)``) into CONFIG's model. A file that does not fit is refused with the
first missing / unexpected / mismatched keys. ``tools/test.py``, ``tools/infer.py`` and ``load_from`` do the same
conversion on the fly, so this step is optional there too.

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

from mmplugin.cli.common import run_tool, tool_main


def convert(src: str, dst: str, family: str | None = None, window_size=None, out_indices=(0, 1, 2, 3)) -> dict:
    """Read ``src`` (weights-only), convert it with its family's converter, write ``dst`` atomically."""
    import torch

    from mmplugin.checkpoint import atomic_write_bytes, load_checkpoint_file
    from mmplugin.checkpoint.convert import unwrap_state_dict
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


def convert_for_config(src: str, dst: str, config: str, cfg_options: dict | None = None) -> dict:
    """Read the whole-model checkpoint ``src`` (weights-only), convert it to the model of ``config`` and write ``dst``
    atomically; raises CheckpointError when it does not fit."""
    import torch

    from mmplugin.apis import build_model
    from mmplugin.checkpoint import atomic_write_bytes, load_checkpoint_file
    from mmplugin.loading.fit import strict_model_state_dict
    ckpt = load_checkpoint_file(src)
    model = build_model(config, cfg_options=cfg_options)  # random weights: they come from SRC
    out, conversion = strict_model_state_dict(model, ckpt, source=src, model_name=config)
    meta = dict(ckpt.get('meta') or {}) if isinstance(ckpt, dict) and isinstance(ckpt.get('meta'), dict) else {}
    meta.update(converted_from=osp.basename(src), config=osp.basename(config),
                conversion=conversion.describe() or 'none: already in the model\'s layout')
    buf = io.BytesIO()
    torch.save({'state_dict': out, 'meta': meta}, buf)
    atomic_write_bytes(buf.getvalue(), dst)
    print(conversion.describe() or 'nothing to convert: the checkpoint is already in the model\'s layout')
    print(f'wrote {len(out)} tensors to {dst}; they load strictly into the model of {config}')
    return out


@tool_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('src')
    p.add_argument('dst')
    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.models.backbones.base import FAMILIES
    p.add_argument('--family', choices=list(FAMILIES), default=None, help='default: detect from the keys')
    p.add_argument('--window-size', type=int, default=None,
                   help='families with window attention: resize / regenerate position tables for this window')
    p.add_argument('--out-indices', type=int, nargs='+', default=None, help='default: 0 1 2 3')
    p.add_argument('--config', default=None,
                   help="whole-model checkpoint: convert it to this config's detector / segmentor (strict fit)")
    from mmplugin.cli.common import CfgOptionsAction
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction, help='with --config: override config entries')
    args = p.parse_args(argv)
    from mmplugin.checkpoint import CheckpointError
    if args.config is None and args.cfg_options:
        p.error('--cfg-options needs --config')
    if args.config is not None:
        given = [f for f, v in (('--family', args.family), ('--window-size', args.window_size),
                                ('--out-indices', args.out_indices)) if v is not None]
        if given:
            p.error(f'{", ".join(given)} cannot be combined with --config: the config decides the backbone')
        if not osp.isfile(args.config):
            print(f'error: config file not found: {args.config}', file=sys.stderr)
            return 2
    try:
        if args.config is not None:
            convert_for_config(args.src, args.dst, args.config, args.cfg_options)
        else:
            convert(args.src, args.dst, args.family, args.window_size, tuple(args.out_indices or (0, 1, 2, 3)))
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    run_tool(main)
