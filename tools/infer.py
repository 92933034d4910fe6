"""Run a trained detector or segmentor on one image and draw its predictions to a PNG.

    python tools/infer.py CONFIG CHECKPOINT IMAGE --out result.png [--score-thr 0.3] [--device cpu] [--allow-partial]
        [--compile] [--fast [auto|bf16|fp16]]

CHECKPOINT is a path or an http(s) URL. It must fit the model of CONFIG (see tools/test.py), unless --allow-partial.
Published whole-model checkpoints (official Swin detection / segmentation repositories, mmdet / mmseg model
zoos) load as they are: their backbone part is converted on the fly (docs/published_checkpoints.md).

Uses mmdet's DetLocalVisualizer or mmseg's SegLocalVisualizer, chosen by the config's default_scope.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))


def _fits(cfg, ckpt, args) -> bool:
    """Strict loading: refuse a checkpoint that does not fit the config's model unless --allow-partial.

    Checked on a separately built model, before mmdet's / mmseg's init functions load the file (they fail with a
    bare ``KeyError`` or evaluate random weights behind a warning on a checkpoint that does not fit).
    """
    import copy

    from mmengine.registry import MODELS, init_default_scope

    from mmplugin.checkpoint import check_checkpoint_fits
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(copy.deepcopy(cfg.model))
    problem = check_checkpoint_fits(model, ckpt, source=args.checkpoint, model_name=args.config)
    if problem and not args.allow_partial:
        print(f'error: {problem}\nPass --allow-partial to run anyway.', file=sys.stderr)
        return False
    if problem:
        print(f'warning (--allow-partial): {problem}', file=sys.stderr)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('image')
    p.add_argument('--out', default='result.png')
    p.add_argument('--score-thr', type=float, default=0.3)
    p.add_argument('--device', default='cpu')
    p.add_argument('--allow-partial', action='store_true',
                   help='run even if the checkpoint does not fit the model (missing keys stay random)')
    p.add_argument('--compile', action='store_true',
                   help='torch.compile the backbone and neck (fullgraph, dynamic shapes); pays off on GPUs')
    p.add_argument('--fast', nargs='?', const='auto', choices=('auto', 'bf16', 'fp16'), default=None,
                   help='backbone + neck in reduced precision, heads fp32 (auto: bf16 on CPUs with AVX512-BF16/AMX '
                        'and on Ampere+ GPUs, fp16 on older GPUs; fp32 with a warning elsewhere). Before positional '
                        'arguments write --fast=MODE')
    args = p.parse_args(argv)
    import mmplugin  # noqa: F401
    from mmplugin.checkpoint import CheckpointError, is_url, load_checkpoint_file
    for what, path in (('config', args.config), ('checkpoint', args.checkpoint), ('image', args.image)):
        if not osp.isfile(path) and not (what == 'checkpoint' and is_url(path)):
            print(f'error: {what} file not found: {path}', file=sys.stderr)
            return 2
    try:
        ckpt = load_checkpoint_file(args.checkpoint)  # fail fast, with a clear message, on a bad file
    except CheckpointError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    import mmcv
    from mmengine.config import Config

    from mmplugin.deploy import compile_backbone_and_neck, enable_fast_inference
    cfg = Config.fromfile(args.config)
    cfg.model.get('backbone', {}).pop('init_cfg', None)
    img = mmcv.imread(args.image, channel_order='rgb')
    if not _fits(cfg, ckpt, args):
        return 2
    if cfg.get('default_scope') == 'mmseg':
        from mmengine.runner import load_checkpoint
        from mmseg.apis import inference_model, init_model
        from mmseg.registry import DATASETS
        from mmseg.visualization import SegLocalVisualizer
        # mmseg's init_model needs checkpoint['meta'] (KeyError otherwise): load here, classes from the config
        # when the checkpoint does not name them
        model = init_model(cfg, None, device=args.device)
        load_checkpoint(model, args.checkpoint, map_location='cpu')
        meta = (ckpt.get('meta') or {}).get('dataset_meta') if isinstance(ckpt, dict) else None
        model.dataset_meta = meta or DATASETS.build(dict(cfg.test_dataloader.dataset, lazy_init=True)).metainfo
        if args.fast:
            dtype = enable_fast_inference(model, args.fast, args.device)
            print(f'--fast {args.fast}: backbone + neck in {dtype or "torch.float32"}, heads in torch.float32')
        if args.compile:
            compile_backbone_and_neck(model)
        result = inference_model(model, args.image)
        vis = SegLocalVisualizer(name='mmplugin_infer', alpha=0.6)
        vis.dataset_meta = model.dataset_meta
        vis.add_datasample('result', img, result, draw_gt=False, show=False, out_file=args.out)
    else:
        from mmdet.apis import inference_detector, init_detector
        from mmdet.visualization import DetLocalVisualizer
        model = init_detector(cfg, args.checkpoint, device=args.device)
        if args.fast:
            dtype = enable_fast_inference(model, args.fast, args.device)
            print(f'--fast {args.fast}: backbone + neck in {dtype or "torch.float32"}, heads in torch.float32')
        if args.compile:
            compile_backbone_and_neck(model)
        result = inference_detector(model, args.image)
        vis = DetLocalVisualizer(name='mmplugin_infer')
        vis.dataset_meta = model.dataset_meta
        vis.add_datasample('result', img, result, draw_gt=False, show=False, pred_score_thr=args.score_thr,
                           out_file=args.out)
        kept = int((result.pred_instances.scores >= args.score_thr).sum())
        print(f'{kept} instances above score {args.score_thr}')
    print(f'visualisation written to {os.path.abspath(args.out)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
