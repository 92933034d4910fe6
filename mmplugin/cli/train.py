"""Train an mmdet or mmseg model from a config, with the plugin's backbones registered.

    python tools/train.py configs/swiftformer/swiftformer_l1_maskrcnn_1x_coco.py [--work-dir DIR] [--resume [PATH]]
        [--amp] [--amp-dtype float16|bfloat16] [--compile-backbone] [--cfg-options key=value ...]
        [--launcher none|pytorch|slurm]

Multi-GPU / multi-node: tools/dist_train.sh (torchrun, c10d rendezvous) or tools/slurm_train.sh; mmengine's
distributed runner does the work (``runner_type='FlexibleRunner'`` in a config for FSDP); docs/distributed.md.
``--resume`` without a path continues from the newest intact checkpoint in the work dir.
"""
from __future__ import annotations

import argparse
import os
import sys

from mmplugin.cli.common import run_tool, tool_main


def parse_args(argv=None):
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description='Train a detector or segmentor (mmdet / mmseg config).')
    p.add_argument('config', help='config file')
    p.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    p.add_argument('--resume', nargs='?', const='auto', default=None,
                   help='resume from PATH or http(s) URL, or (no value) from the newest intact checkpoint in the work '
                   'dir (unreadable newer ones are named in the log)')
    p.add_argument('--amp', action='store_true',
                   help='mixed precision: fp16 autocast with loss scaling on CUDA, bf16 autocast on the CPU')
    p.add_argument('--amp-dtype', choices=['float16', 'bfloat16'], default=None,
                   help='the autocast dtype of --amp (implies --amp); float16 runs with dynamic loss scaling')
    p.add_argument('--compile-backbone', action='store_true',
                   help='compile the backbone with torch.compile (inductor, one graph per input size, built on its '
                   'first iteration): for fixed-size training; pays for SwiftFormer, not for Swin on CPUs '
                   '(mmplugin/engine/compiled.py)')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction, help='override config values, key=value')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


@tool_main
def main(argv=None) -> int:
    args = parse_args(argv)
    import mmplugin  # noqa: F401  registers the backbones, safe checkpoint loading
    from mmplugin.apis import load_config
    from mmplugin.checkpoint import CheckpointError
    from mmplugin.cli.datasets import DatasetConfigError, check_datasets
    from mmplugin.cli.runner import build_runner, prepare_runner_cfg
    cfg = load_config(args.config, args.cfg_options)  # a missing file: one error line (tool_main)
    from mmplugin.apis import check_model_wiring
    check_model_wiring(cfg, args.config)  # a neck that does not fit the backbone: the config's mistake, before any data
    try:
        check_datasets(cfg, splits=('train', 'val') if cfg.get('val_cfg') else ('train', ))
    except DatasetConfigError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    try:
        prepare_runner_cfg(cfg, args)
    except CheckpointError as err:
        print(f'error: --resume: {err}', file=sys.stderr)
        return 2
    runner = build_runner(cfg)
    if args.compile_backbone:
        from mmplugin.engine.compiled import compile_backbone
        backbone = compile_backbone(runner.model)
        print(f'{type(backbone).__name__} compiled (inductor): the first iteration of each input size builds its '
              'graph', flush=True)
    import torch
    if not torch.cuda.is_available():
        from mmplugin.analysis.load import TRAINING, load_warning
        busy = load_warning(torch.get_num_threads(), effect=TRAINING)
        if busy:
            print(busy, file=sys.stderr, flush=True)
    runner.train()
    return 0


if __name__ == '__main__':
    run_tool(main)
