"""Latency table of eager fp32 and the export runtimes (onnxruntime, ExecuTorch + XNNPACK, LiteRT; more rows from
``--rows module:function`` builders such as int8 paths), side by side in one process on this CPU.

    python tools/edge_table.py [--models swiftformer_xs swiftformer_l1_semfpn ...] [--size 512] [--rounds 10]
        [--threads 2] [--runtimes onnx executorch litert] [--rows pkg.module:function ...] [--workdir DIR]
        [--out table.md] [--retain-memory]
    python tools/edge_table.py --breakdown --models swiftformer_l1_semfpn   # where eager's time goes, per part

Prints a markdown table (ms, speed-up over eager fp32, max relative error or task metric, file size, CPU);
see :mod:`mmplugin.analysis.bench` and docs/deploy_edge.md. A runtime that is not installed is skipped with a note.
"""
from __future__ import annotations

import argparse
import tempfile

from mmplugin.cli.common import add_retain_memory_option, apply_retain_memory_option, run_tool, tool_main


@tool_main
def main(argv=None) -> int:
    from mmplugin.analysis import bench
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', choices=bench.MODELS, default=None,
                   help='default: every model (with --breakdown: the segmentors)')
    p.add_argument('--size', type=int, default=512, help='square input size (default 512, the ADE20K crop)')
    p.add_argument('--rounds', type=int, default=10, help='timed rounds; medians are reported')
    p.add_argument('--threads', type=int, default=2, help='threads of eager and of every runtime')
    p.add_argument('--runtimes', nargs='*', choices=bench.FP32_RUNTIMES, default=list(bench.FP32_RUNTIMES))
    p.add_argument('--rows', nargs='*', default=[], help='extra row builders, module:function')
    p.add_argument('--workdir', default=None, help='where the exported files go (default: a temporary folder)')
    p.add_argument('--out', default=None, help='also write the table to this markdown file')
    p.add_argument('--breakdown', action='store_true',
                   help='instead: eager fp32 time, MACs and share of the matmul peak of each part of the segmentors '
                        '(backbone, neck, head, final resize); see mmplugin.analysis.breakdown')
    add_retain_memory_option(p)
    args = p.parse_args(argv)
    apply_retain_memory_option(p, args)
    if args.size < 32 or args.rounds < 1 or args.threads < 1:
        p.error('--size must be >= 32, --rounds and --threads >= 1')
    if args.breakdown:
        args.models = args.models or list(bench.SEGMENTORS)
        return _breakdown(p, args)
    args.models = args.models or list(bench.MODELS)
    try:
        builders = [bench.row_builder(s) for s in args.rows]
    except (ValueError, ImportError, AttributeError) as err:
        p.error(f'--rows: {err}')
    with tempfile.TemporaryDirectory() as tmp:
        results, notes = {}, []
        for name in args.models:
            results[name], n = bench.measure(name, args.size, args.rounds, args.threads, args.workdir or tmp,
                                             args.runtimes, builders)
            notes += n
        text = bench.table(results, args.size, args.threads, args.rounds)
    print(text)
    for note in notes:
        print('note:', note)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n' + ''.join(f'\nnote: {n}' for n in notes) + '\n')
    return 0


def _breakdown(p: argparse.ArgumentParser, args) -> int:
    from mmplugin.analysis import bench
    from mmplugin.analysis.breakdown import breakdown_table, segmentor_breakdown
    if args.rows or any(m not in bench.SEGMENTORS for m in args.models):
        p.error(f'--breakdown takes segmentors only ({", ".join(bench.SEGMENTORS)}) and no --rows')
    text = '\n\n'.join(breakdown_table(m, segmentor_breakdown(m, args.size, args.rounds, args.threads), args.size,
                                         args.threads, args.rounds) for m in args.models)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')
    return 0


if __name__ == '__main__':
    run_tool(main)
