"""Export a detector's / segmentor's backbone, backbone + neck, or whole segmentor to ONNX with dynamic batch, height
and width, then check onnxruntime against PyTorch eager at other sizes; or, with ``--backend``, to a mobile runtime
(ExecuTorch + XNNPACK ``.pte``, LiteRT ``.tflite``, Core ML ``.mlpackage``) at the fixed ``--example`` shape
(default 1x512x512), checked against eager in that runtime (Core ML: converted and inspected; predicts on macOS).

    python tools/export.py CONFIG [CHECKPOINT] --out FILE.onnx [--part backbone|backbone+neck|model]
        [--opset 18] [--example 2x224x256] [--verify 1x97x131 3x61x300 ...] [--cfg-options ...]
    python tools/export.py CONFIG [CHECKPOINT] --backend executorch|litert|coreml --out FILE [--part ...]
        [--example 1x512x512] [--precision fp16|fp32 (coreml)]

Exporter: ``torch.onnx.export(dynamo=True)`` (torch.export capture + onnxscript), opset 18 by default; see
:mod:`mmplugin.deploy`. The graph's input ``input`` is the image after the model's data preprocessor (mean/std
normalised, RGB, float32, ``(B, 3, H, W)``, any B, H, W); outputs are ``out0 ...``. ``--part model`` is supported for
segmentors (logits at the input size) and single-stage detectors (raw head maps); two-stage detectors (Mask R-CNN,
Cascade) go through mmdeploy: tools/export_mmdeploy.py. Without CHECKPOINT the weights are random (useful to check
exportability). The checkpoint must fit the exported part, and only that part: a backbone-only file (e.g. converted
ImageNet weights) exports with ``--part backbone`` and is refused for ``backbone+neck``, naming the missing keys
(:func:`mmplugin.apis.build_model`). Exits 1 when any ``--verify`` size differs by more than ``--tol`` (relative)."""
from __future__ import annotations

import argparse
import os.path as osp
import sys
import time

from mmplugin.cli.common import require_files, run_tool, tool_main


def _shape(s: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in s.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected BxHxW such as 2x224x256, got {s!r}') from None
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f'expected BxHxW with positive sizes such as 2x224x256, got {s!r}')
    return dims


def parse_args(argv=None):
    from mmplugin.cli.common import CfgOptionsAction
    from mmplugin.export import DEFAULT_OPSET, PARTS
    from mmplugin.export.backends import BACKENDS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint', nargs='?', default=None, help='trained weights (loaded weights-only)')
    p.add_argument('--out', required=True, help='output file (.onnx, .pte, .tflite, .mlpackage)')
    p.add_argument('--backend', choices=BACKENDS, default='onnx',
                   help='onnx: dynamic sizes, onnxruntime; others: fixed --example shape (docs/deploy_edge.md)')
    p.add_argument('--precision', choices=('fp16', 'fp32'), default=None,
                   help='Core ML compute precision (default fp16); coreml only')
    p.add_argument('--part', choices=PARTS, default='backbone')
    p.add_argument('--opset', type=int, default=DEFAULT_OPSET)
    p.add_argument('--example', type=_shape, default=None,
                   help='BxHxW of the example input used for capture; onnx: every dim >= 2 (default 2x224x256); '
                   'other backends: the fixed input shape (default 1x512x512)')
    p.add_argument('--verify', type=_shape, nargs='*', default=None,
                   help='BxHxW sizes at which the runtime is compared with eager (none: skip; default onnx '
                   '1x97x131 3x61x300 1x33x45, other backends the --example shape, the only one they take)')
    p.add_argument('--tol', type=float, default=1e-4, help='max relative error allowed by --verify')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    args = p.parse_args(argv)
    if args.precision and args.backend != 'coreml':
        p.error('--precision applies to --backend coreml only')
    if args.opset != DEFAULT_OPSET and args.backend != 'onnx':
        p.error('--opset applies to --backend onnx only')
    onnx = args.backend == 'onnx'
    args.example = args.example or ((2, 224, 256) if onnx else (1, 512, 512))
    if args.verify is None:
        args.verify = [(1, 97, 131), (3, 61, 300), (1, 33, 45)] if onnx else [args.example]
    return args


@tool_main
def main(argv=None) -> int:
    args = parse_args(argv)
    require_files(('config', args.config), ('checkpoint', args.checkpoint))
    from mmplugin.apis import build_model
    from mmplugin.export import ExportPart, example_input, export_onnx, onnx_parity
    model = build_model(args.config, args.checkpoint, part=args.part, cfg_options=args.cfg_options,
                        announce_random=True)
    try:
        part = ExportPart(model, args.part).eval()
    except ValueError as err:  # the part does not exist in this model (no neck; a two-stage detector's 'model')
        print(f'error: {err}', file=sys.stderr)
        return 2
    if args.backend != 'onnx':
        from mmplugin.export.backends import export_main
        return export_main(part, args.backend, args.out, args.example, args.verify, args.tol,
                           **({'precision': args.precision} if args.precision else {}))
    b, h, w = args.example
    example = example_input(b, (h, w), channels=getattr(part.backbone, 'in_channels', 3))
    t = time.perf_counter()
    names = export_onnx(part, args.out, example, opset=args.opset)
    print(f'exported {args.part} of {osp.basename(args.config)} to {args.out} in {time.perf_counter() - t:.0f} s '
          f'(opset {args.opset}, dynamic batch/height/width, outputs {", ".join(names)})')
    if not args.verify:
        return 0
    c = example.shape[1]
    errs = onnx_parity(part, args.out, [(bb, c, hh, ww) for bb, hh, ww in args.verify])
    print('onnxruntime vs eager (max relative error):')
    for shape, err in errs.items():
        print(f'  {"x".join(map(str, shape)):>16s}  {err:.2e}  {"ok" if err <= args.tol else "FAIL"}')
    return 0 if all(e <= args.tol for e in errs.values()) else 1


if __name__ == '__main__':
    run_tool(main)
