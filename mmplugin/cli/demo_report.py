"""Pictures, loss curves and the summary table of ``tools/demo.sh``.

    python tools/demo_report.py det-pictures CONFIG CHECKPOINT --out det_result.png [--num 3] [--score-thr 0.5]
    python tools/demo_report.py seg-pictures CONFIG CHECKPOINT --out seg_result.png [--num 3]
    python tools/demo_report.py curves --run detector=WORK_DIR --run segmentor=WORK_DIR --out loss_curves.png
    python tools/demo_report.py summary [--det-test DIR] [--seg-test DIR] [--time NAME=SECONDS ...]
        [--picture PATH ...]

Pictures: ground truth (left) and prediction (right) for the first ``--num`` validation images of the config's test
set, at >= 384 px, class colours from the config's palette with a legend; detections below ``--score-thr`` are not
drawn.
"""
from __future__ import annotations

import argparse
import os.path as osp

from mmplugin.cli.common import run_tool, tool_main


def _meta(cfg):
    ds = cfg.test_dataloader.dataset
    meta = ds.get('metainfo') or {}
    return list(meta['classes']), [tuple(int(c) for c in p) for p in meta['palette']]


def _load_cfg(args):
    """The demo config with ``--cfg-options`` applied and no pretrained download; its classes and palette."""
    from mmplugin.apis import load_config
    cfg = load_config(args.config, args.cfg_options)
    cfg.model.get('backbone', {}).pop('init_cfg', None)
    return (cfg, *_meta(cfg))


def det_pictures(args) -> int:
    import numpy as np
    from mmdet.apis import inference_detector, init_detector
    from pycocotools import mask as mask_util
    from pycocotools.coco import COCO

    from mmplugin.apis import load_checkpoint_checked
    from mmplugin.demo import report
    cfg, classes, palette = _load_cfg(args)
    ds = cfg.test_dataloader.dataset
    root = ds.get('data_root', '')
    coco = COCO(osp.join(root, ds.ann_file))
    cat_ids = coco.getCatIds(catNms=classes)
    label_of = {c: classes.index(coco.cats[c]['name']) for c in cat_ids}
    import warnings
    with warnings.catch_warnings():  # mmdet warns that it names COCO's classes without a checkpoint: set below
        warnings.filterwarnings('ignore', message='checkpoint is None')
        model = init_detector(cfg, None, device='cpu')
    load_checkpoint_checked(model, args.checkpoint, model_name=args.config)  # CheckpointError when it does not fit
    model.dataset_meta = dict(classes=classes, palette=palette)
    rows, kept = [], []
    for img_id in sorted(coco.getImgIds())[:args.num]:
        info = coco.imgs[img_id]
        path = osp.join(root, ds.data_prefix['img'], info['file_name'])
        import mmcv
        img = mmcv.imread(path, channel_order='rgb')
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id, iscrowd=False))
        boxes = np.array([[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2], a['bbox'][1] + a['bbox'][3]]
                          for a in anns], np.float32).reshape(-1, 4)
        masks = np.stack([mask_util.decode(a['segmentation']) for a in anns]) if anns else None
        gt = report.draw_instances(img, boxes, [label_of[a['category_id']] for a in anns], classes, palette, masks)
        pred = inference_detector(model, path).pred_instances
        scores = pred.scores.numpy()
        pm = pred.masks.numpy() if 'masks' in pred else None
        rows.append((gt, report.draw_instances(img, pred.bboxes.numpy(), pred.labels.numpy(), classes, palette, pm,
                                               scores, args.score_thr)))
        kept.append(int((scores >= args.score_thr).sum()))
    report.save_rgb(args.out, report.side_by_side(rows, classes, palette,
                                                  ('ground truth', f'prediction (score >= {args.score_thr})')))
    print(f'{args.out}: {len(rows)} images, {kept} predictions >= {args.score_thr} '
          f'({sum(len(coco.getAnnIds(imgIds=i)) for i in sorted(coco.getImgIds())[:args.num])} ground-truth objects)')
    return 0


def seg_pictures(args) -> int:
    import glob

    import mmcv
    from mmseg.apis import inference_model, init_model

    from mmplugin.apis import load_checkpoint_checked
    from mmplugin.demo import report
    cfg, classes, palette = _load_cfg(args)
    ds = cfg.test_dataloader.dataset
    model = init_model(cfg, None, device='cpu')
    load_checkpoint_checked(model, args.checkpoint, model_name=args.config)  # CheckpointError when it does not fit
    model.dataset_meta = dict(classes=classes, palette=palette)
    img_dir = osp.join(ds.data_root, ds.data_prefix['img_path'])
    seg_dir = osp.join(ds.data_root, ds.data_prefix['seg_map_path'])
    rows = []
    for path in sorted(glob.glob(osp.join(img_dir, '*' + ds.img_suffix)))[:args.num]:
        img = mmcv.imread(path, channel_order='rgb')
        name = osp.basename(path)[:-len(ds.img_suffix)] + ds.seg_map_suffix
        gt = mmcv.imread(osp.join(seg_dir, name), flag='unchanged')
        pred = inference_model(model, path).pred_sem_seg.data[0].numpy()
        rows.append((report.draw_label_map(img, gt, palette), report.draw_label_map(img, pred, palette)))
    report.save_rgb(args.out, report.side_by_side(rows, classes, palette))
    print(f'{args.out}: {len(rows)} images')
    return 0


def curves(args) -> int:
    from mmplugin.demo import report
    runs = {}
    for item in args.run:
        title, _, work_dir = item.partition('=')
        runs[title] = report.find_scalars(work_dir)
    report.plot_loss_curves(runs, args.out)
    print(f'{args.out}: loss curves of {", ".join(runs)}')
    return 0


def summary(args) -> int:
    from mmplugin.demo import report
    rows = []
    if args.det_test:
        m = report.latest_metrics(args.det_test)
        for key, name in (('coco/bbox_mAP', 'bbox AP'), ('coco/bbox_mAP_50', 'bbox AP50'),
                          ('coco/segm_mAP', 'segm AP'), ('coco/segm_mAP_50', 'segm AP50')):
            rows.append((f'detector {name}', f'{m[key]:.3f}' if key in m else 'missing'))
    if args.seg_test:
        m = report.latest_metrics(args.seg_test)
        rows.append(('segmentor mIoU', f'{m["mIoU"]:.1f}' if 'mIoU' in m else 'missing'))
        logs = sorted(glob_logs(args.seg_test))
        if logs:
            with open(logs[-1]) as f:
                for name, iou in report.per_class_iou(f.read()).items():
                    rows.append((f'  IoU {name}', f'{iou:.1f}'))
    for item in args.time or []:
        name, _, secs = item.partition('=')
        rows.append((f'wall time {name}', report.fmt_seconds(float(secs))))
    for pic in args.picture or []:
        rows.append(('picture', pic))
    print(report.summary_table(rows))
    return 0


def glob_logs(work_dir):
    import glob
    return glob.glob(osp.join(work_dir, '*', '*.log'))


@tool_main
def main(argv=None) -> int:
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest='cmd', required=True)
    for name in ('det-pictures', 'seg-pictures'):
        s = sub.add_parser(name)
        s.add_argument('config')
        s.add_argument('checkpoint')
        s.add_argument('--out', required=True)
        s.add_argument('--num', type=int, default=3)
        s.add_argument('--score-thr', type=float, default=0.5)
        s.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    s = sub.add_parser('curves')
    s.add_argument('--run', action='append', required=True, help='TITLE=WORK_DIR (of tools/train.py)')
    s.add_argument('--out', required=True)
    s = sub.add_parser('summary')
    s.add_argument('--det-test')
    s.add_argument('--seg-test')
    s.add_argument('--time', action='append', help='NAME=SECONDS')
    s.add_argument('--picture', action='append')
    args = p.parse_args(argv)
    import mmplugin  # noqa: F401
    return dict(zip(('det-pictures', 'seg-pictures', 'curves', 'summary'),
                    (det_pictures, seg_pictures, curves, summary)))[args.cmd](args)


if __name__ == '__main__':
    run_tool(main)
