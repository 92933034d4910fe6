"""The demo: its data generator, its pictures / curves / summary code, and a shortened run of its configs.

The shortened run trains each demo config (and the ResNet-18 A/B config) for 2 iterations on a 4-image copy of the
synthetic data, evaluates it, and runs tools/demo_report.py on the result, in-process (no downloads).
"""
from __future__ import annotations

import importlib
import json
import os.path as osp
from pathlib import Path

import cv2
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DET = 'configs/demo/swiftformer_xs_maskrcnn_shapes.py'
SEG = 'configs/demo/swiftformer_xs_semfpn_shapes.py'
SEG_FT = 'configs/demo/swiftformer_xs_semfpn_shapes_ft.py'  # what tools/demo.sh trains: backbone from DET
R18 = 'configs/demo/r18_maskrcnn_shapes.py'
EF_L1 = 'configs/demo/efficientformer_l1_maskrcnn_shapes.py'  # the A/B's third row
PALETTE = [(220, 20, 60), (0, 160, 0), (30, 60, 230)]
CLASSES = ('circle', 'rectangle', 'triangle')


def _tool(name):
    """The command line of tools/<name>.py (mmplugin.cli.<name>)."""
    return importlib.import_module(f'mmplugin.cli.{name}')


# ------------------------------------------------------------------------------------------------- data generator
def test_instance_dataset_is_deterministic_and_consistent(tmp_path):
    from pycocotools import mask as mask_util

    from mmplugin.demo import make_instance_dataset
    a = make_instance_dataset(str(tmp_path / 'a'), num_train=5, num_val=2, size=64, seed=3)
    make_instance_dataset(str(tmp_path / 'b'), num_train=5, num_val=2, size=64, seed=3)
    make_instance_dataset(str(tmp_path / 'c'), num_train=5, num_val=2, size=64, seed=4)
    same = (tmp_path / 'a/train/train_00000.png').read_bytes() == (tmp_path / 'b/train/train_00000.png').read_bytes()
    assert same
    assert (tmp_path / 'a/train/train_00000.png').read_bytes() != (tmp_path / 'c/train/train_00000.png').read_bytes()
    coco = json.loads(Path(a['train']).read_text())
    assert [c['name'] for c in coco['categories']] == list(CLASSES)
    assert len(coco['images']) == 5 and coco['annotations']
    for ann in coco['annotations']:
        m = mask_util.decode(ann['segmentation'])
        assert m.shape == (64, 64) and m.sum() == ann['area'] >= 30  # occluded masks: what is visible
        ys, xs = np.nonzero(m)
        assert ann['bbox'] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
        assert 1 <= ann['category_id'] <= 3
    assert json.loads(Path(a['val']).read_text())['images'][0]['file_name'] == 'val_00000.png'


def test_semantic_dataset_labels(tmp_path):
    from mmplugin.demo import make_semantic_dataset
    make_semantic_dataset(str(tmp_path), num_train=6, num_val=1, size=48, seed=0)
    labels = [cv2.imread(str(p), cv2.IMREAD_UNCHANGED) for p in sorted((tmp_path / 'annotations/training').iterdir())]
    assert len(labels) == 6 and all(lab.shape == (48, 48) and lab.dtype == np.uint8 for lab in labels)
    values = set(np.unique(np.stack(labels)).tolist())
    assert 0 in values and values <= {0, 1, 2, 3} and len(values) >= 3
    img = cv2.imread(str(tmp_path / 'images/training/00000.png'))
    assert img.shape == (48, 48, 3)


# --------------------------------------------------------------------------------------------- pictures / summary
def test_draw_instances_colours_threshold_and_size():
    from mmplugin.demo import report
    img = np.full((96, 96, 3), 128, np.uint8)
    masks = np.zeros((2, 96, 96), np.uint8)
    masks[0, 10:40, 10:40] = 1
    masks[1, 60:90, 60:90] = 1
    boxes = np.array([[10, 10, 40, 40], [60, 60, 90, 90]], np.float32)
    out = report.draw_instances(img, boxes, [0, 2], CLASSES, PALETTE, masks, scores=[0.9, 0.3], score_thr=0.5)
    assert out.shape == (384, 384, 3)  # upscaled 4x
    inside = out[100, 100].astype(int)  # mask 0 at (25, 25) -> (100, 100): half grey, half crimson
    assert np.abs(inside - (0.5 * 128 + 0.5 * np.array(PALETTE[0]))).max() <= 1
    assert (out[300, 300] == 128).all()  # the 0.3-score instance is not drawn
    out = report.draw_instances(img, boxes, [0, 2], CLASSES, PALETTE, masks)  # ground truth: no scores
    assert np.abs(out[300, 300].astype(int) - (0.5 * 128 + 0.5 * np.array(PALETTE[2]))).max() <= 1


def test_label_map_side_by_side_and_legend():
    from mmplugin.demo import report
    img = np.zeros((40, 50, 3), np.uint8)
    label = np.zeros((40, 50), np.uint8)
    label[:, 25:] = 2
    pal = [(0, 0, 0)] + PALETTE
    a = report.draw_label_map(img, label, pal, alpha=1.0)
    assert min(a.shape[:2]) >= 384 and (a[0, 0] == 0).all() and tuple(a[0, -1]) == PALETTE[1]
    sheet = report.side_by_side([(a, a), (a, a)], ('background', ) + CLASSES, pal)
    assert sheet.shape[1] >= 2 * a.shape[1] and sheet.shape[0] >= 2 * a.shape[0] + 28
    strip = sheet[-28:]
    for colour in PALETTE:  # one swatch per class in the legend
        assert (strip == np.array(colour, np.uint8)).all(-1).sum() >= 50


def test_per_class_iou_summary_and_metrics(tmp_path):
    from mmplugin.demo import report
    log = '\n'.join([
        '11/30 10:00:00 - mmengine - INFO - per class results:',
        '11/30 10:00:00 - mmengine - INFO - ',
        '+------------+-------+-------+', '|   Class    |  IoU  |  Acc  |', '+------------+-------+-------+',
        '| background | 97.61 | 99.1  |', '|   circle   | 41.7  | 50.0  |', '|  triangle  |  0.0  |  0.0  |',
        '+------------+-------+-------+'])
    assert report.per_class_iou(log) == {'background': 97.61, 'circle': 41.7, 'triangle': 0.0}
    table = report.summary_table([('detector bbox AP', '0.612'), ('wall time total', report.fmt_seconds(605))])
    assert '| detector bbox AP | 0.612' in table and '10 min 05 s' in table
    assert len({len(line) for line in table.splitlines()}) == 1  # aligned
    run = tmp_path / '20260101_000000'
    run.mkdir()
    (run / '20260101_000000.json').write_text(json.dumps({'coco/bbox_mAP': 0.5}) + '\n'
                                              + json.dumps({'coco/bbox_mAP': 0.7, 'step': 3}) + '\n')
    assert report.latest_metrics(str(tmp_path))['coco/bbox_mAP'] == 0.7


def test_loss_curves_png(tmp_path):
    from mmplugin.demo import report
    vis = tmp_path / 'w/20260101_000000/vis_data'
    vis.mkdir(parents=True)
    rows = [dict(step=i, loss=2.0 / i, loss_cls=1.0 / i, lr=0.1) for i in range(1, 6)] + [{'coco/bbox_mAP': 0.1}]
    (vis / 'scalars.json').write_text('\n'.join(json.dumps(r) for r in rows))
    out = report.plot_loss_curves({'det': report.find_scalars(str(tmp_path / 'w'))}, str(tmp_path / 'c.png'))
    img = cv2.imread(out)
    assert img is not None and img.shape[1] >= 400
    with pytest.raises(FileNotFoundError):
        report.find_scalars(str(tmp_path / 'nothing'))


# ------------------------------------------------------------------------------------------- shortened demo runs
@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo')
    from mmplugin.demo import make_instance_dataset, make_semantic_dataset
    make_instance_dataset(str(root / 'shapes_coco'), num_train=4, num_val=2, seed=0)
    make_semantic_dataset(str(root / 'shapes_ade'), num_train=4, num_val=2, seed=1)
    return root


def _det_opts(root):
    sub = f'{root}/shapes_coco/'
    ann = f'{sub}annotations/instances_val.json'
    return [f'train_dataloader.dataset.data_root={sub}', f'val_dataloader.dataset.data_root={sub}',
            f'test_dataloader.dataset.data_root={sub}', f'val_evaluator.ann_file={ann}',
            f'test_evaluator.ann_file={ann}']


def _seg_opts(root):
    sub = f'{root}/shapes_ade'
    return [f'{k}_dataloader.dataset.data_root={sub}' for k in ('train', 'val', 'test')]


_SHORT = ['train_cfg.max_iters=2', 'train_cfg.val_interval=100', 'train_dataloader.num_workers=0',
          'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
          'val_dataloader.persistent_workers=False', 'test_dataloader.num_workers=0',
          'test_dataloader.persistent_workers=False', 'default_hooks.checkpoint.interval=2']


@pytest.mark.slow
@pytest.mark.parametrize('config', [DET, R18, EF_L1])
def test_demo_detector_short_run(tmp_path, tiny, config, capsys):
    train, test, report_tool = _tool('train'), _tool('test'), _tool('demo_report')
    cfg = str(ROOT / config)
    assert train.main([cfg, '--work-dir', str(tmp_path / 'det'), '--cfg-options', *_det_opts(tiny), *_SHORT]) == 0
    ckpt = Path((tmp_path / 'det/last_checkpoint').read_text().strip())
    assert ckpt.name == 'iter_2.pth'
    if config == R18:
        return  # the A/B config builds and trains; evaluation is the same code as the plugin's
    assert test.main([cfg, str(ckpt), '--work-dir', str(tmp_path / 'det_test'),
                      '--cfg-options', *_det_opts(tiny)[1:], 'test_dataloader.num_workers=0',
                      'test_dataloader.persistent_workers=False']) == 0
    if config == EF_L1:
        return  # the comparison row trains and evaluates through the same tools
    out = tmp_path / 'det_result.png'
    assert report_tool.main(['det-pictures', cfg, str(ckpt), '--out', str(out), '--num', '2',
                             '--cfg-options', *_det_opts(tiny)[2:3]]) == 0
    img = cv2.imread(str(out))
    assert img.shape[0] >= 2 * 384 and img.shape[1] >= 2 * 384
    capsys.readouterr()
    assert report_tool.main(['summary', '--det-test', str(tmp_path / 'det_test'), '--time', 'det_train=65',
                             '--picture', str(out)]) == 0
    summary = capsys.readouterr().out
    for row in ('detector bbox AP ', 'detector bbox AP50', 'detector segm AP ', '1 min 05 s', str(out)):
        assert row in summary, summary
    assert 'missing' not in summary, summary


def _detector_checkpoint(path: Path) -> dict:
    """A demo detector's whole-model checkpoint as tools/train.py writes it; returns its state dict."""
    import torch
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmplugin  # noqa: F401
    init_default_scope('mmdet')
    torch.manual_seed(0)
    det = MODELS.build(Config.fromfile(str(ROOT / DET)).model)
    sd = det.state_dict()
    torch.save({'meta': {'iter': 800}, 'state_dict': sd}, path)
    return sd


def test_finetune_config_starts_from_the_detector_backbone(tmp_path):
    """The segmentor demo.sh trains loads the detector checkpoint's backbone.* weights exactly, weights-only."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    det_sd = _detector_checkpoint(tmp_path / 'det.pth')
    cfg = Config.fromfile(str(ROOT / SEG_FT))
    assert cfg.model.backbone.init_cfg.checkpoint == 'work_dirs/demo/det/iter_800.pth'  # DET's last iteration
    assert Config.fromfile(str(ROOT / DET)).train_cfg.max_iters == 800
    cfg.model.backbone.init_cfg.checkpoint = str(tmp_path / 'det.pth')
    init_default_scope('mmseg')
    seg = MODELS.build(cfg.model)
    seg.init_weights()
    got = seg.backbone.state_dict()
    assert got and all(torch.equal(v, det_sd['backbone.' + k]) for k, v in got.items())


@pytest.mark.slow
@pytest.mark.parametrize('config', [SEG, SEG_FT])
def test_demo_segmentor_short_run(tmp_path, tiny, config, capsys):
    train, test, report_tool = _tool('train'), _tool('test'), _tool('demo_report')
    cfg = str(ROOT / config)
    init = []
    if config == SEG_FT:  # as tools/demo.sh: the detector's checkpoint on the command line
        _detector_checkpoint(tmp_path / 'det.pth')
        init = [f'model.backbone.init_cfg.checkpoint={tmp_path / "det.pth"}']
    assert train.main([cfg, '--work-dir', str(tmp_path / 'seg'), '--cfg-options', *_seg_opts(tiny), *_SHORT,
                       'train_dataloader.batch_size=2', *init]) == 0
    ckpt = (tmp_path / 'seg/last_checkpoint').read_text().strip()
    assert test.main([cfg, ckpt, '--work-dir', str(tmp_path / 'seg_test'), '--cfg-options', *_seg_opts(tiny),
                      'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']) == 0
    out = tmp_path / 'seg_result.png'
    assert report_tool.main(['seg-pictures', cfg, ckpt, '--out', str(out), '--num', '2',
                             '--cfg-options', *_seg_opts(tiny)]) == 0
    assert cv2.imread(str(out)).shape[0] >= 2 * 384
    if config == SEG_FT:
        return  # curves: mmseg's visualizer is a process-wide singleton named 'visualizer', so a second in-process
        # run logs its scalars to the first run's folder (demo.sh runs each step in its own process)
    assert report_tool.main(['curves', '--run', f'seg={tmp_path / "seg"}', '--out', str(tmp_path / 'c.png')]) == 0
    assert osp.getsize(tmp_path / 'c.png') > 1000
    capsys.readouterr()
    assert report_tool.main(['summary', '--seg-test', str(tmp_path / 'seg_test')]) == 0
    summary = capsys.readouterr().out
    assert 'segmentor mIoU' in summary and 'missing' not in summary
    for name in ('background', 'circle', 'rectangle', 'triangle'):
        assert f'IoU {name}' in summary, summary
