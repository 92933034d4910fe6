"""Post-training static int8 of a detector's / segmentor's backbone (+ neck), calibrated on its training split.

    python tools/quantize.py CONFIG CHECKPOINT --backend xnnpack|onnxruntime [--out DIR]
        [--part backbone|backbone+neck] [--keep-float attention_norm|attention|none|NAME ...] [--num-calib 32]
        [--eval] [--cfg-options ...]

``xnnpack``: PT2E quantisation lowered to an ExecuTorch ``.pte`` (XNNPACK delegate, run through ExecuTorch's
runtime); ``onnxruntime``: static QDQ ONNX. Fixed input shape (the first calibration image's, batch 1). Without
``--eval`` it writes the int8 file and prints the lowest output cosine against fp32; with ``--eval`` it evaluates
fp32 and int8 on the config's test split (same checkpoint, same images, heads in float): docs/int8.md.
Needs the ``edge`` extra (executorch, torchao) for ``xnnpack`` and onnxruntime for ``onnxruntime``.
"""
from __future__ import annotations

import argparse
import json
import sys

from mmplugin.cli.common import require_files, run_tool, tool_main


def parse_args(argv=None):
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('--backend', required=True, choices=('xnnpack', 'onnxruntime'))
    p.add_argument('--out', help='folder of the int8 file (default work_dirs/int8/<config name>)')
    p.add_argument('--part', default='backbone+neck', choices=('backbone', 'backbone+neck'))
    p.add_argument('--keep-float', nargs='+', default=None,
                   help='presets (attention_norm, attention, none) or module class / qualified names kept float '
                        '(default: attention_norm for xnnpack, attention for onnxruntime; docs/int8.md)')
    p.add_argument('--num-calib', type=int, default=32, help='training images used for calibration')
    p.add_argument('--eval', action='store_true', help='evaluate fp32 and int8 on the test split')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    args = p.parse_args(argv)
    if args.num_calib < 1:
        p.error('--num-calib must be >= 1')
    return args


@tool_main
def main(argv=None) -> int:
    args = parse_args(argv)
    import mmplugin  # noqa: F401
    from mmplugin.quantization.evaluate import evaluate_int8, quantize_checkpoint
    require_files(('config', args.config), ('checkpoint', args.checkpoint))
    kw = dict(backend=args.backend, part=args.part, keep_float=args.keep_float, num_calib=args.num_calib,
              work_dir=args.out, cfg_options=args.cfg_options)
    try:
        if args.eval:
            res = evaluate_int8(args.config, args.checkpoint, **kw)
        else:
            res = quantize_checkpoint(args.config, args.checkpoint, **kw)
            res = {k: v for k, v in res.items() if k not in ('runner', 'runner_obj')}
    except ValueError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == '__main__':
    run_tool(main)
