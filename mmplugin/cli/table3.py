"""The SwiftFormer paper's Table 3 comparison measured on this CPU: parameters, GMACs, backbone and whole-model
latency of its eight backbones side by side (ratios to SwiftFormer-L1), beside the paper's accuracy.

    python tools/table3.py [--rounds 3] [--threads 2] [--backbone-only] [--plot docs/images/table3.png] [--json F]

Random weights (nothing is downloaded); Mask R-CNN at 1333x800, Semantic FPN at 512x512, batch 1, eval mode.
"""
from __future__ import annotations

import argparse
import json

from mmplugin.cli.common import run_tool, tool_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--rounds', type=int, default=3, help='interleaved timing rounds (medians)')
    p.add_argument('--threads', type=int, default=None, help='torch threads (default: torch\'s)')
    p.add_argument('--backbone-only', action='store_true', help='time the backbones only (no whole models)')
    p.add_argument('--plot', help='write accuracy against latency to this PNG')
    p.add_argument('--json', help='write the measured rows to this file')
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error('--rounds must be >= 1')
    return args


@tool_main
def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from mmplugin.analysis.table3 import format_table, measure, plot
    from mmplugin.utils.cpu import describe
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(rounds=args.rounds, whole=not args.backbone_only)
    machine = f'{describe()}, {torch.get_num_threads()} threads, torch {torch.__version__}'
    print(f'# {machine}; medians of {args.rounds} interleaved rounds; (x) = SwiftFormer-L1 time / time')
    print(format_table(rows))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(machine=machine, rounds=args.rounds, rows=rows), f, indent=1)
    if args.plot:
        print('picture:', plot(rows, args.plot, title=machine))
    return 0


if __name__ == '__main__':
    run_tool(main)
