"""Backbone speed and peak memory, side by side in one process, printed as ratios and drawn as a PNG.

Any registered backbone family can be timed. Peers are the implementations a user would otherwise pick, declared per
family in :mod:`mmplugin.analysis.peers` and run with the same weights where the layouts allow; e.g. SwiftFormer: the
official formulation, the plugin after ``switch_to_deploy()``, mmdet's ResNet-50 / ResNet-18; Swin V1: mmdet's
``SwinTransformer``. The first peer is the baseline of the ratios; a family without peers is timed alone.

Timings interleave the models round by round and report medians, so machine noise hits all of them alike; only ratios
are meaningful on shared machines. Peak memory of a training step (forward + backward) is measured in a fresh
subprocess per model (max RSS on CPU, ``max_memory_allocated`` on CUDA). A warning comes first when other processes
load the machine (:func:`mmplugin.analysis.load_warning`).

Examples::

    python tools/benchmark.py swiftformer --arch l1 --sizes 800x1216 --plot work_dirs/bench_sf.png
    python tools/benchmark.py swin --arch tiny --sizes 512x512 800x1216 --memory
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from mmplugin.analysis import benchmark_models, load_warning, parse_hw, peak_memory, supports_checkpointing, time_models
from mmplugin.cli.common import run_tool, tool_main


def parse_size(s: str) -> tuple[int, int]:
    try:
        return parse_hw(s)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


@tool_main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.models.backbones.base import FAMILIES
    parser.add_argument('family', choices=list(FAMILIES))
    parser.add_argument('--arch', default=None, help="backbone arch (default: the family's first arch)")
    parser.add_argument('--sizes', nargs='+', type=parse_size, default=[(800, 1216)], help='HxW input sizes')
    parser.add_argument('--rounds', type=int, default=5, help='timed forwards per model and size')
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--bf16', action='store_true', help='time under bf16 autocast')
    parser.add_argument('--compile', action='store_true',
                        help='also time each model under torch.compile(fullgraph=True, dynamic=True) as NAME+compile')
    parser.add_argument('--memory', action='store_true', help='also measure training-step peak memory')
    parser.add_argument('--plot', default=None, help='write a PNG of time against input size here')
    parser.add_argument('--json', default=None, help='write all figures as JSON here')
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    arch = args.arch or FAMILIES[args.family].default_arch()
    device = torch.device(args.device)
    busy = load_warning(torch.get_num_threads()) if device.type == 'cpu' else None
    if busy:
        print(busy, file=sys.stderr, flush=True)
    torch.manual_seed(0)
    models = benchmark_models(args.family, arch, device)
    if args.compile:
        from mmplugin.inference.fast import compile_module
        for name in list(models):
            if name.startswith('mmplugin'):
                twin = benchmark_models(args.family, arch, device)[name]
                twin.load_state_dict(models[name].state_dict())
                models[f'{name}+compile'] = compile_module(twin.eval())
    baseline = next(iter(models))
    results = {'family': args.family, 'arch': arch, 'device': str(device), 'sizes': {}}
    print(f'{args.family} {arch} on {device} ({torch.get_num_threads()} threads), median of {args.rounds} rounds')
    for size in args.sizes:
        t = time_models(models, size, device, args.rounds, dtype=torch.bfloat16 if args.bf16 else None)
        results['sizes'][f'{size[0]}x{size[1]}'] = t
        print(f'\n{size[0]}x{size[1]}: speed-up over {baseline} (higher is faster)')
        for name, sec in t.items():
            print(f'  {name:18s} {t[baseline] / sec:6.2f}x   ({sec * 1000:8.1f} ms)')
    if args.memory:
        size = args.sizes[0]
        print(f'\ntraining-step peak memory at batch 2, {size[0]}x{size[1]} (MiB, ratio to {baseline}):')
        mem = {}
        names = list(dict.fromkeys([baseline, 'mmplugin']))
        for name in names:
            for cp in (False, True):
                if cp and not supports_checkpointing(models[name]):
                    continue
                mem[f'{name}{" +with_cp" if cp else ""}'] = peak_memory(args.family, arch, name, size, cp, device)
        base = mem[baseline]
        for k, v in mem.items():
            print(f'  {k:26s} {v:9.0f} MiB  {v / base:5.2f}x')
        results['peak_memory_mib'] = mem
    if args.plot:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        labels = list(results['sizes'])
        pixels = [parse_hw(s)[0] * parse_hw(s)[1] / 1e6 for s in labels]
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in models:
            ax.plot(pixels, [results['sizes'][s][name] * 1000 for s in labels], marker='o', label=name)
        ax.set_xlabel('input size (megapixels)')
        ax.set_ylabel('eval forward time (ms)')
        ax.set_title(f'{args.family} {arch} on {device}')
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f'\nplot written to {args.plot}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == '__main__':
    run_tool(main)
