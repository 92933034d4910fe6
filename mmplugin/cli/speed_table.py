"""Backbone speed against the CPU's own matmul peak, the peers and the deployment runtimes, in one process.

    python tools/speed_table.py [--size 800x1216] [--rounds 5] [--models swin:tiny swiftformer:l1]
        [--runtimes eager compiled onnxruntime openvino] [--bf16 auto|on|off] [--whole CONFIG[@HxW] ...]
        [--train [HxW]] [--train-detector CONFIG[@HxW] ...] [--json F]

For each backbone (batch 1, eval, random weights): median seconds of interleaved rounds for the family's peers
(:mod:`mmplugin.analysis.peers`, e.g. mmdet's Swin) and the plugin in eager fp32, compiled by inductor (frozen
weights, static shape; ``compiled``), exported to ONNX (dynamic sizes) in onnxruntime and in OpenVINO (when
installed; compiled for the input's shape, f32 and, where the CPU has bf16 kernels, bf16 inference precision), and
under bf16 autocast where the CPU has bf16 kernels (``--bf16 on`` forces it on CPUs that emulate bf16). Beside them,
in the same rounds: the plugin's GEMM-only time (every linear and 1x1 convolution of its forward alone at its shape,
on the fastest of MKL, oneDNN and oneDNN with a prepacked weight: row "GEMMs alone"; column "x its GEMMs" = a row's
time over it) and a 4096x4096 product on the faster kernel (the "matmul peak"). Each row gives GFLOP/s (2 x the
multiply-adds counted by ``tools/get_flops.py``), its share of that peak, the speed ratio to the first peer, and the
accuracy cost (max relative error of the outputs against the plugin's eager fp32 outputs). Row "mmplugin
prepacked" is the plugin as ``--fast`` runs it (linear weights frozen and packed).

``--train [HxW]`` adds backbone training steps (batch 2, AdamW; fp32 and bf16 autocast) of the peers and the
plugin beside the plugin's GEMM-only step, with peak memory in fresh processes; with ``--runtimes ... compiled``
also the plugin's step under ``torch.compile`` (forward and backward graphs), in the same rounds.

``--whole CONFIG`` also times a whole detector / segmentor's inference (random weights, every proposal kept) and
the share of it spent in ``extract_feat`` (backbone + neck), which bounds what a reduced-precision backbone
(``tools/test.py --fast``) can gain on the whole model.

``--train-detector CONFIG`` times a whole Swin V1 detector's training step (batch 2, AdamW, fp32) with the plugin's
backbone against the same detector with mmdet's ``SwinTransformer``: same weights, batch and sampling
(:mod:`mmplugin.analysis.detector_step`), plus the peak memory of a step of each in a fresh process. ``--models``
with no value leaves the backbone rows out.

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
from mmplugin.analysis.detector_step import detector_training_rows
from mmplugin.analysis.speed import backbone_rows, cpu_description, training_rows, whole_model_rows
from mmplugin.analysis.timing import parse_hw
from mmplugin.cli.common import add_retain_memory_option, apply_retain_memory_option, run_tool, tool_main


def _print_backbone_rows(rows: list[dict], size) -> None:
    print(f'\n| backbone ({size[0]}x{size[1]}, batch 1) | implementation | runtime | precision | ms | GFLOP/s | '
          'matmul peak GFLOP/s | % of peak | speed vs first row | x its GEMMs | max rel. error vs plugin eager fp32 '
          '(- : another network) |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        pk, gf = r['peak_gflops'], r['gflops']
        share = f'{100 * gf / pk:.0f}%' if pk and gf else '-'
        err = '-' if r['rel_err'] is None else f'{r["rel_err"]:.1e}'
        gemm = '-' if r['gemm_ratio'] is None else f'{r["gemm_ratio"]:.2f}x'
        print(f'| {r["backbone"]} ({r["model_gflop"]:.0f} GFLOP) | {r["impl"]} | {r["runtime"]} | {r["precision"]} | '
              f'{1000 * r["seconds"]:.0f} | {"-" if gf is None else f"{gf:.0f}"} | {pk or 0:.0f} | {share} | '
              f'{r["ratio"]:.2f}x | {gemm} | {err} |')


def _cell(value, fmt: str, scale: float = 1.0) -> str:
    """A table cell: ``value * scale`` formatted with ``fmt`` (e.g. ``'{:.2f}x'``), ``-`` for a missing value."""
    return '-' if value is None else fmt.format(value * scale)


def _print_detector_rows(rows: list[dict]) -> None:
    print('\n| detector training step (AdamW, fp32) | implementation | ms | speed vs mmdet | peak MiB | '
          'memory vs mmdet | first-step loss |')
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        loss = _cell(r['losses'] and r['losses']['loss'], '{:.6f}')
        print(f'| {osp.basename(r["config"])} (batch {r["batch"]}, {r["size"][0]}x{r["size"][1]}) | {r["impl"]} | '
              f'{_cell(r["seconds"], "{:.0f}", 1000)} | {_cell(r["ratio"], "{:.2f}x")} | '
              f'{_cell(r["peak_mib"], "{:.0f}")} | {_cell(r["mem_ratio"], "{:.2f}x")} | {loss} |')


@tool_main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--size', default='800x1216', help='HxW (default 800x1216, a COCO test image)')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--models', nargs='*', default=['swin:tiny', 'swiftformer:l1'],
                   help='FAMILY:ARCH (none: no backbone rows, e.g. with --train-detector alone)')
    p.add_argument('--runtimes', nargs='*', default=['eager', 'onnxruntime', 'openvino'],
                   choices=['eager', 'compiled', 'onnxruntime', 'openvino'],
                   help='compiled: torch.compile (inductor, frozen weights, static shape; minutes to compile); with '
                        "--train also the plugin's training step compiled (forward and backward graphs)")
    p.add_argument('--bf16', choices=['auto', 'on', 'off'], default='auto',
                   help='bf16 autocast rows: auto = only where the CPU has bf16 kernels')
    p.add_argument('--whole', nargs='*', default=[],
                   help='CONFIG[@HxW]: configs whose whole-model inference is also timed (at --size unless @HxW)')
    p.add_argument('--train', nargs='?', const='512x768', default=None, metavar='HxW',
                   help='also time backbone training steps (batch 2, forward + backward + AdamW; default 512x768) '
                        'and their peak memory (fresh processes, with and without activation checkpointing); the '
                        "plugin's fp32 step also with its linears on the kernel this CPU does not use by default "
                        "(oneDNN or, on Intel CPUs, BLAS)")
    p.add_argument('--train-detector', nargs='*', default=[], metavar='CONFIG[@HxW]',
                   help='Swin V1 detector configs whose whole training step (batch 2, AdamW, fp32) is timed with the '
                        "plugin's backbone and with mmdet's SwinTransformer (same weights, data and sampling), with "
                        'the peak memory of a step in fresh processes (at 512x768 unless @HxW)')
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
    print('4096x4096 matmul GFLOP/s (faster of MKL and oneDNN) and every GEMM of the plugin\'s forward alone (row '
          '"GEMMs alone", column "x its GEMMs") are timed in the same rounds as each backbone'
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
    if rows:
        _print_backbone_rows(rows, size)
    train = []
    if args.train and args.models:
        tsize = tuple(int(v) for v in args.train.lower().split('x'))
        for spec in args.models:
            family, arch = spec.split(':')
            print(f'\ntiming {family} {arch} training steps at batch 2, {tsize[0]}x{tsize[1]} ...', flush=True)
            train += training_rows(family, arch, tsize, args.rounds, bf16, compiled='compiled' in args.runtimes)
        print(f'\n| backbone training step (batch 2, {tsize[0]}x{tsize[1]}, AdamW) | implementation | precision | '
              'ms | speed vs first row | x its GEMMs | peak MiB | memory vs first |')
        print('|---|---|---|---|---|---|---|---|')
        for r in train:
            print(f'| {r["backbone"]} | {r["impl"]} | {r["precision"]} | {_cell(r["seconds"], "{:.0f}", 1000)} | '
                  f'{_cell(r["ratio"], "{:.2f}x")} | {_cell(r["gemm_ratio"], "{:.2f}x")} | '
                  f'{_cell(r["peak_mib"], "{:.0f}")} | {_cell(r["mem_ratio"], "{:.2f}x")} |')
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
    detector = []
    for spec in args.train_detector:
        config, _, at = spec.partition('@')
        dsize = parse_hw(at) if at else (512, 768)
        print(f'\ntiming training steps of {osp.basename(config)} at batch 2, {dsize[0]}x{dsize[1]} ...', flush=True)
        detector += detector_training_rows(config, dsize, args.rounds)
    if detector:
        _print_detector_rows(detector)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(cpu=cpu, command=command, rows=rows, train=train, whole=whole, detector=detector), f,
                      indent=2)
    return rows, whole, train, detector


if __name__ == '__main__':
    run_tool(main)
