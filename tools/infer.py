"""Run a trained detector or segmentor on one image and draw its predictions to a PNG.

    python tools/infer.py CONFIG CHECKPOINT IMAGE --out result.png [--score-thr 0.3] [--device cpu] [--compile]

Uses mmdet's DetLocalVisualizer or mmseg's SegLocalVisualizer, chosen by the config's default_scope.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('image')
    p.add_argument('--out', default='result.png')
    p.add_argument('--score-thr', type=float, default=0.3)
    p.add_argument('--device', default='cpu')
    p.add_argument('--compile', action='store_true',
                   help='torch.compile the backbone and neck (fullgraph, dynamic shapes); pays off on GPUs')
    args = p.parse_args(argv)
    for what, path in (('config', args.config), ('checkpoint', args.checkpoint), ('image', args.image)):
        if not osp.isfile(path):
            print(f'error: {what} file not found: {path}', file=sys.stderr)
            return 2
    import mmcv
    import mmplugin  # noqa: F401
    from mmengine.config import Config

    from mmplugin.deploy import compile_backbone_and_neck
    cfg = Config.fromfile(args.config)
    cfg.model.get('backbone', {}).pop('init_cfg', None)
    img = mmcv.imread(args.image, channel_order='rgb')
    if cfg.get('default_scope') == 'mmseg':
        from mmseg.apis import inference_model, init_model
        from mmseg.visualization import SegLocalVisualizer
        model = init_model(cfg, args.checkpoint, device=args.device)
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
