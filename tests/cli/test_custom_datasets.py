"""The your-own-data templates (configs/custom/): copied and edited as docs/custom_data.md says, they train and
validate on a dataset of their own.

Each template is copied with only its variable block edited (data root, class names, sizes, schedule) to point at
a 4-image copy of the synthetic data, trained 2 iterations with validation, and checked against the data itself:
the dataset keeps exactly the annotation file's instances of the named classes, the heads predict that many
classes, the schedule counts iterations, and the evaluator reports its metrics.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DET = ROOT / 'configs/custom/swiftformer_l1_maskrcnn_20k_coco_format.py'
SEG = ROOT / 'configs/custom/swiftformer_l1_semfpn_40k_ade_layout.py'


def _edited_copy(template: Path, dst: Path, values: dict[str, str]) -> Path:
    """``template`` with the named variables of its block set to ``values`` (Python source), as a user would."""
    text = template.read_text()
    for name, value in values.items():
        text, n = re.subn(rf'^{name} = .*$', f'{name} = {value}', text, count=1, flags=re.M)
        assert n == 1, f'{template.name} has no variable {name}'
    dst.write_text(text)
    return dst


def _train_and_validate(cfg_path: Path, work_dir: Path):
    from mmengine.config import Config

    import mmplugin  # noqa: F401  (the `mmplugin::` base)
    from mmplugin.cli.runner import build_runner, prepare_runner_cfg
    cfg = Config.fromfile(str(cfg_path))
    cfg.model.backbone.init_cfg = None  # no ImageNet file here
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].update(num_workers=0, persistent_workers=False)
    prepare_runner_cfg(cfg, argparse.Namespace(work_dir=str(work_dir), config=str(cfg_path)))
    runner = build_runner(cfg)
    runner.train()
    return cfg, runner, runner.val()


def test_templates_parse_with_their_documented_defaults():
    from mmengine.config import Config

    import mmplugin  # noqa: F401
    det = Config.fromfile(str(DET))
    assert det.train_cfg.type == 'IterBasedTrainLoop' and det.train_cfg.max_iters == det.max_iters
    assert det.model.roi_head.bbox_head.num_classes == len(det.classes) == det.model.roi_head.mask_head.num_classes
    assert det.train_dataloader.sampler.type == 'InfiniteSampler' and 'shuffle' in det.train_dataloader.sampler
    assert det.val_evaluator.ann_file == det.data_root + det.val_ann
    steps = det.param_scheduler[1]
    assert not steps.by_epoch and steps.milestones == [det.max_iters * 8 // 12, det.max_iters * 11 // 12]
    assert det.default_hooks.checkpoint.interval == det.val_interval and not det.default_hooks.checkpoint.by_epoch
    seg = Config.fromfile(str(SEG))
    assert seg.model.decode_head.num_classes == len(seg.classes)
    assert seg.train_dataloader.dataset.type == 'BaseSegDataset' and 'ann_file' not in seg.train_dataloader.dataset
    assert seg.param_scheduler[0].end == seg.max_iters == seg.train_cfg.max_iters


@pytest.mark.slow
def test_coco_format_template_trains_on_its_own_data(tmp_path):
    from mmplugin.demo import make_instance_dataset
    data = tmp_path / 'my_coco'
    make_instance_dataset(str(data), num_train=4, num_val=2, seed=0)
    classes = ('circle', 'triangle')  # a subset: the json's rectangles must be left out
    cfg_path = _edited_copy(DET, tmp_path / 'my_config.py', {
        'data_root': repr(f'{data}/'), 'classes': repr(classes), 'input_scale': '(192, 192)',
        'max_iters': '2', 'val_interval': '2', 'batch_size': '2'})
    cfg, runner, metrics = _train_and_validate(cfg_path, tmp_path / 'work')

    ann = json.loads((data / 'annotations/instances_train.json').read_text())
    names = {c['id']: c['name'] for c in ann['categories']}
    expected = sorted(classes.index(names[a['category_id']]) for a in ann['annotations']
                      if names[a['category_id']] in classes)
    dataset = runner.train_dataloader.dataset
    assert tuple(dataset.metainfo['classes']) == classes
    got = sorted(inst['bbox_label'] for i in range(len(dataset)) for inst in dataset.get_data_info(i)['instances'])
    assert got == expected and expected, 'the dataset must hold the named classes\' instances, and only those'
    model = runner.model
    assert model.roi_head.bbox_head.num_classes == model.roi_head.mask_head.num_classes == len(classes)
    assert (tmp_path / 'work/iter_2.pth').is_file() and runner.iter == 2
    assert {'coco/bbox_mAP', 'coco/segm_mAP'} <= set(metrics)


@pytest.mark.slow
def test_ade_layout_template_trains_on_its_own_data(tmp_path):
    import numpy as np
    from PIL import Image

    from mmplugin.demo import make_semantic_dataset
    data = tmp_path / 'my_ade'
    make_semantic_dataset(str(data), num_train=4, num_val=2, seed=1)
    classes = ('background', 'circle', 'rectangle', 'triangle')
    labels = set()
    for png in (data / 'annotations/training').glob('*.png'):
        labels |= set(np.unique(np.asarray(Image.open(png))).tolist())
    assert labels <= set(range(len(classes))), labels  # the data's label values name these classes
    cfg_path = _edited_copy(SEG, tmp_path / 'my_config.py', {
        'data_root': repr(str(data)), 'img_suffix, seg_map_suffix': "'.png', '.png'", 'classes': repr(classes),
        'crop_size': '(128, 128)', 'scale': '(160, 160)', 'max_iters': '2', 'val_interval': '2',
        'batch_size': '2'})
    cfg, runner, metrics = _train_and_validate(cfg_path, tmp_path / 'work')
    assert tuple(runner.train_dataloader.dataset.metainfo['classes']) == classes
    assert len(runner.train_dataloader.dataset) == 4 and len(runner.val_dataloader.dataset) == 2
    assert runner.model.decode_head.num_classes == len(classes)
    assert (tmp_path / 'work/iter_2.pth').is_file() and runner.iter == 2
    assert 'mIoU' in metrics and 0.0 <= metrics['mIoU'] <= 100.0
