"""Evaluate a checkpoint (COCO bbox/segm AP, ADE20K mIoU, ...) with an mmdet or mmseg config.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--tta] [--show-dir DIR] [--cfg-options ...]
        [--format-only --out-dir DIR] [--out FILE.pkl] [--allow-partial] [--launcher none|pytorch|slurm]
        [--compile [dynamic|static]] [--compile-sizes N] [--fast [auto|bf16|fp16]]
        [--runtime pytorch|openvino|onnxruntime]

CHECKPOINT is a path or an http(s) URL (downloaded once into the torch hub cache). Checkpoints load with
weights-only semantics (see mmplugin.checkpoint) and strictly: one that does not fit the model of CONFIG (a
backbone-only or another model's checkpoint) is an error listing the first missing / unexpected keys, unless
``--allow-partial`` is given.
Published whole-model checkpoints (official Swin detection / segmentation repositories, mmdet / mmseg model
zoos) load as they are: their backbone part is converted on the fly (docs/published_checkpoints.md).
``--tta`` uses the config's ``tta_model`` / ``tta_pipeline`` (multi-scale + flip).
``--format-only --out-dir DIR`` writes test-server files instead of scoring (COCO results json; ADE20K PNG label
maps), ``--out FILE.pkl`` dumps the raw predictions, ``--show-dir DIR`` draws every prediction: docs/evaluation.md.
``--runtime openvino`` (or ``onnxruntime``) runs backbone + neck in that runtime, heads in PyTorch
(:mod:`mmplugin.inference.runtime`; OpenVINO compiles one model per input shape, cached; speed: docs/benchmarks.md).
``--compile static`` compiles backbone + neck per input size with frozen weights (:mod:`mmplugin.inference.compiled`;
for SwiftFormer the fastest PyTorch path on a CPU at fixed sizes; Swin runs faster eager, with its attention kernel).
"""
from __future__ import annotations

import argparse
import os
import sys

from mmplugin.cli.common import require_files, run_tool, tool_main
from mmplugin.cli.inference_options import add_inference_options


def parse_args(argv=None):
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description='Evaluate a trained detector or segmentor.')
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('--work-dir')
    p.add_argument('--tta', action='store_true', help="test-time augmentation from the config's tta_* entries")
    p.add_argument('--show-dir', help='draw every prediction into this folder (detectors and segmentors)')
    p.add_argument('--format-only', action='store_true',
                   help='write test-server files into --out-dir instead of scoring (COCO results json for '
                        'bbox / segm; PNG label maps for segmentors)')
    p.add_argument('--out-dir', help='folder of the --format-only files')
    p.add_argument('--out', help='dump the raw predictions to this .pkl file (as mmdet\'s / mmseg\'s test tools)')
    add_inference_options(p)
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    p.add_argument('--allow-partial', action='store_true',
                   help='evaluate even if the checkpoint does not fit the model (missing keys stay random)')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    if args.format_only != bool(args.out_dir):
        p.error('--format-only and --out-dir go together')
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def _plain(v):
    try:
        return round(float(v), 4)  # numpy scalars print as plain numbers
    except (TypeError, ValueError):
        return v


def _apply_evaluation_options(cfg, args) -> None:
    """--tta, --format-only / --out-dir and --show-dir on the config (mmplugin.cli.evaluation)."""
    from mmplugin.cli.evaluation import configure_format_only, configure_show_dir, configure_tta
    if args.tta:
        configure_tta(cfg)
    if args.format_only:
        for path in configure_format_only(cfg, args.out_dir):
            print(f'--format-only: writing {path}')
    if args.show_dir:
        print(f'--show-dir: drawing predictions into {configure_show_dir(cfg, args.show_dir)}')


@tool_main
def main(argv=None) -> int:
    args = parse_args(argv)
    import mmplugin  # noqa: F401
    from mmplugin.apis import load_checkpoint_checked, load_config
    from mmplugin.checkpoint import load_checkpoint_file
    from mmplugin.cli.datasets import check_datasets
    from mmplugin.cli.evaluation import add_dump_metric, check_distinct_test_outputs, check_dump_path, is_segmentor_cfg
    from mmplugin.cli.runner import build_runner, prepare_runner_cfg

    require_files(('config', args.config), ('checkpoint', args.checkpoint), urls=True)
    cfg = load_config(args.config, args.cfg_options)
    from mmplugin.apis import check_model_wiring
    check_model_wiring(cfg, args.config)  # a neck that does not fit the backbone: the config's mistake, before any data
    check_distinct_test_outputs(args.out, args.out_dir, args.show_dir, is_segmentor_cfg(cfg))
    check_datasets(cfg, splits=('test', ))  # user errors end as one line (mmplugin.cli.common)
    ckpt = load_checkpoint_file(args.checkpoint)  # fail fast, with a clear message, on a bad file
    args.resume = None
    prepare_runner_cfg(cfg, args)
    cfg.load_from = None  # the file is read once (above) and loaded, checked, into the runner's model (below)
    cfg.model.get('backbone', {}).pop('init_cfg', None)  # weights come from the checkpoint
    _apply_evaluation_options(cfg, args)
    if args.out:
        check_dump_path(args.out)
    runner = build_runner(cfg)
    if args.out:
        print(f'--out: dumping raw predictions to {add_dump_metric(runner, args.out, is_segmentor_cfg(cfg))}')
    # the tools' one loading path: published layouts converted, every key checked; what fits is loaded
    problem = load_checkpoint_checked(runner.model, ckpt, strict=False, source=args.checkpoint,
                                      model_name=args.config)
    # what mmengine's own loading would tell the hooks (an EMAHook copies these weights into its EMA model)
    from mmplugin.loading import unwrap_model
    loaded = {'meta': ckpt.get('meta', {}) if isinstance(ckpt, dict) else {},
              'state_dict': unwrap_model(runner.model).state_dict()}
    del ckpt
    runner.call_hook('after_load_checkpoint', checkpoint=loaded)
    if problem and not args.allow_partial:
        print(f'error: {problem}\nPass --allow-partial to evaluate anyway.', file=sys.stderr)
        return 2
    if problem:
        print(f'warning (--allow-partial): {problem}', file=sys.stderr)
    from mmengine.model import is_model_wrapper
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model  # unwrap DDP
    if args.tta:
        model = model.module  # the detector / segmentor inside the TTA wrapper
    from mmplugin.cli.inference_options import apply_inference_options
    feats = apply_inference_options(model, args, next(model.parameters()).device)
    metrics = runner.test()
    if feats is not None:
        print(feats.message())
        feats.close()
    print({k: _plain(v) for k, v in (metrics or {}).items()})
    return 0


if __name__ == '__main__':
    run_tool(main)
