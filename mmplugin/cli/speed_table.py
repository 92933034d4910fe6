"""Backbone speed against the CPU's own matmul peak, the peers and the deployment runtimes, in one process.

    python tools/speed_table.py [--size 800x1216] [--rounds 5] [--models swin:tiny swiftformer:l1]
        [--runtimes eager onnxruntime openvino] [--bf16 auto|on|off] [--whole CONFIG[@HxW] ...] [--json F]

For each backbone (batch 1, eval, random weights): median seconds of interleaved rounds for the family's peers
(:mod:`mmplugin.analysis.peers`, e.g. mmdet's Swin) and the plugin in eager fp32, the plugin exported to ONNX
(dynamic sizes) in onnxruntime and OpenVINO (when installed; f32 inference precision), and under bf16 autocast where
the CPU has bf16 kernels (``--bf16 on`` forces it on CPUs that emulate bf16). Each row gives GFLOP/s (2 x the
multiply-adds counted by ``tools/get_flops.py``), the share of a 4096x4096 matmul's GFLOP/s timed in the same
interleaved rounds in the same precision, the speed ratio to the first peer, and the accuracy cost (max relative
error of the outputs against the plugin's eager fp32 outputs).

``--whole CONFIG`` also times a whole detector / segmentor's inference (random weights, every proposal kept) and
the share of it spent in ``extract_feat`` (backbone + neck), which bounds what a reduced-precision backbone
(``tools/test.py --fast``) can gain on the whole model.

Numbers depend on the processor: the CPU model and the command are printed with the table; quote them with it.
"""
from __future__ import annotations

import argparse
import json
import os.path as osp
import sys
import tempfile

import torch

from mmplugin.analysis import load_warning
from mmplugin.analysis.speed import backbone_rows, cpu_description, whole_model_rows
from mmplugin.cli.common import add_retain_memory_option, apply_retain_memory_option, run_tool, tool_main


@tool_main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--size', default='800x1216', help='HxW (default 800x1216, a COCO test image)')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--models', nargs='+', default=['swin:tiny', 'swiftformer:l1'], help='FAMILY:ARCH')
    p.add_argument('--runtimes', nargs='*', default=['eager', 'onnxruntime', 'openvino'],
                   choices=['eager', 'onnxruntime', 'openvino'])
    p.add_argument('--bf16', choices=['auto', 'on', 'off'], default='auto',
                   help='bf16 autocast rows: auto = only where the CPU has bf16 kernels')
    p.add_argument('--whole', nargs='*', default=[],
                   help='CONFIG[@HxW]: configs whose whole-model inference is also timed (at --size unless @HxW)')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--json', default=None)
    add_retain_memory_option(p)
    args = p.parse_args(argv)
    import mmplugin  # noqa: F401
    from mmplugin.inference.fast import native_low_precision
    if args.threads:
        torch.set_num_threads(args.threads)
    size = tuple(int(v) for v in args.size.lower().split('x'))
    native_bf16 = native_low_precision('cpu') is torch.bfloat16
    bf16 = args.bf16 == 'on' or (args.bf16 == 'auto' and native_bf16)
    cpu = cpu_description()
    apply_retain_memory_option(p, args)
    command = 'python tools/speed_table.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    print(f'CPU: {cpu}; {torch.get_num_threads()} threads; torch {torch.__version__}\ncommand: {command}', flush=True)
    print('4096x4096 matmul GFLOP/s is timed in the same rounds as each backbone (column "matmul peak")'
          + ('' if native_bf16 else '; this CPU has no bf16 kernels (bf16 rows only with --bf16 on, emulated)'),
          flush=True)
    busy = load_warning(torch.get_num_threads())
    if busy:
        print(busy, file=sys.stderr, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for spec in args.models:
            family, arch = spec.split(':')
            print(f'timing {family} {arch} at {size[0]}x{size[1]} ...', flush=True)
            rows += backbone_rows(family, arch, size, args.rounds, args.runtimes, bf16, workdir)
    print(f'\n| backbone ({size[0]}x{size[1]}, batch 1) | implementation | runtime | precision | ms | GFLOP/s | '
          'matmul peak GFLOP/s | % of peak | speed vs first row | max rel. error vs plugin eager fp32 (- : another '
          'network) |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        pk, gf = r['peak_gflops'], r['gflops']
        share = f'{100 * gf / pk:.0f}%' if pk and gf else '-'
        err = '-' if r['rel_err'] is None else f'{r["rel_err"]:.1e}'
        print(f'| {r["backbone"]} ({r["model_gflop"]:.0f} GFLOP) | {r["impl"]} | {r["runtime"]} | {r["precision"]} | '
              f'{1000 * r["seconds"]:.0f} | {"-" if gf is None else f"{gf:.0f}"} | {pk or 0:.0f} | {share} | '
              f'{r["ratio"]:.2f}x | {err} |')
    whole = []
    for spec in args.whole:
        config, _, at = spec.partition('@')
        wsize = tuple(int(v) for v in at.lower().split('x')) if at else size
        print(f'\ntiming the whole {osp.basename(config)} at {wsize[0]}x{wsize[1]} ...', flush=True)
        whole += whole_model_rows(config, wsize, args.rounds)
    for r in whole:
        print(f'{r["config"]} at {r["size"][0]}x{r["size"][1]}: whole inference {1000 * r["whole_seconds"]:.0f} ms, '
              f'extract_feat (backbone + neck) {1000 * r["extract_feat_seconds"]:.0f} ms = '
              f'{100 * r["extract_feat_share"]:.0f}%: however fast the backbone + neck, the whole model gains at most '
              f'{1 / max(1 - r["extract_feat_share"], 1e-9):.1f}x')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(cpu=cpu, command=command, rows=rows, whole=whole), f, indent=2)
    return rows, whole


if __name__ == '__main__':
    run_tool(main)
