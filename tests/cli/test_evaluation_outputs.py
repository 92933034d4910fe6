"""The evaluation tools on the demo data with randomly initialised demo models: test-server files
(``tools/test.py --format-only``), raw prediction dumps (``--out``), drawings (``--show-dir``), multi-scale + flip
testing (``--tta``, :class:`mmplugin.models.tta.MaskDetTTAModel`), machine-readable predictions of
``tools/infer.py`` (``--pred-out``), and the dataset check of class names against the annotation file.

References: pycocotools (``loadRes``, ``COCOeval``), mmdet's ``DetInferencer`` / ``DetTTAModel``, mmseg's
``inference_model``, the images on disk.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DET = str(ROOT / 'configs/demo/swiftformer_xs_maskrcnn_shapes.py')
SEG = str(ROOT / 'configs/demo/swiftformer_xs_semfpn_shapes.py')
CLASSES = ('circle', 'rectangle', 'triangle')
NUM_VAL = 3


def _tool(name):
    """The command line of tools/<name>.py (mmplugin.cli.<name>)."""
    return importlib.import_module(f'mmplugin.cli.{name}')


def _loader_opts():
    return ['test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """Demo data (3 validation images each) and random-weight checkpoints of the demo detector / segmentor."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmplugin  # noqa: F401
    root = tmp_path_factory.mktemp('eval')
    from mmplugin.demo import make_instance_dataset, make_semantic_dataset
    make_instance_dataset(str(root / 'coco'), num_train=2, num_val=NUM_VAL, seed=0)
    make_semantic_dataset(str(root / 'ade'), num_train=2, num_val=NUM_VAL, seed=1)
    out = {'root': root}
    for kind, cfg_path in (('det', DET), ('seg', SEG)):
        init_default_scope('mmdet' if kind == 'det' else 'mmseg')
        from mmengine.registry import MODELS
        torch.manual_seed(0)
        model = MODELS.build(Config.fromfile(cfg_path).model)
        model.init_weights()
        torch.save({'meta': {'iter': 1}, 'state_dict': model.state_dict()}, root / f'{kind}.pth')
        out[kind] = str(root / f'{kind}.pth')
    # the same segmentor with reduce_zero_label (ADE20K's encoding): 3 classes, label 0 ignored
    init_default_scope('mmseg')
    from mmengine.registry import MODELS
    cfg = Config.fromfile(SEG)
    cfg.model.decode_head.num_classes = 3
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict()}, root / 'seg3.pth')
    out['seg3'] = str(root / 'seg3.pth')
    return out


def det_opts(demo):
    sub = demo['root'] / 'coco'
    return [f'test_dataloader.dataset.data_root={sub}/',
            f'test_evaluator.ann_file={sub}/annotations/instances_val.json', *_loader_opts()]


def seg_opts(demo):
    return [f'test_dataloader.dataset.data_root={demo["root"] / "ade"}', *_loader_opts()]


def _metrics(out: str) -> dict:
    """The metrics dict tools/test.py prints last."""
    import ast
    line = [ln for ln in out.splitlines() if ln.startswith('{')][-1]
    return ast.literal_eval(line)


# ------------------------------------------------------------------------------------------ test-server submission
def test_format_only_coco_json_is_what_was_evaluated(tmp_path, demo, capsys):
    """results.bbox.json / results.segm.json: loadRes reads them, they hold the dumped predictions, and COCOeval on
    them gives the AP that tools/test.py reports for the same checkpoint."""
    from pycocotools import mask as mask_util
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    test = _tool('test')
    assert test.main([DET, demo['det'], '--work-dir', str(tmp_path / 'w1'), '--cfg-options', *det_opts(demo)]) == 0
    scored = _metrics(capsys.readouterr().out)
    sub, pkl = tmp_path / 'submission', tmp_path / 'raw.pkl'
    assert test.main([DET, demo['det'], '--work-dir', str(tmp_path / 'w2'), '--format-only', '--out-dir', str(sub),
                      '--out', str(pkl), '--cfg-options', *det_opts(demo)]) == 0
    assert _metrics(capsys.readouterr().out) == {}  # nothing scored
    gt = COCO(str(demo['root'] / 'coco/annotations/instances_val.json'))
    raw = pickle.loads(pkl.read_bytes())
    assert len(raw) == NUM_VAL
    bbox = json.loads((sub / 'results.bbox.json').read_text())
    segm = json.loads((sub / 'results.segm.json').read_text())
    assert len(bbox) == len(segm) == sum(len(r['pred_instances']['scores']) for r in raw) > 0
    cat_ids = gt.getCatIds(catNms=list(CLASSES))
    for r in raw:
        p = r['pred_instances']
        mine = [d for d in bbox if d['image_id'] == r['img_id']]
        b = p['bboxes'].numpy()
        want = np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], 1)
        # the json holds the same float32 predictions; xyxy -> xywh subtracts in float32 on one side and float64 on
        # the other (ulp of a 192 px coordinate: 1.5e-5 px), scores are copied: bounds far above both
        assert np.allclose([d['bbox'] for d in mine], want, atol=1e-3)
        assert np.allclose([d['score'] for d in mine], p['scores'].numpy(), atol=1e-6)
        assert [d['category_id'] for d in mine] == [cat_ids[i] for i in p['labels'].tolist()]
        masks = [d['segmentation'] for d in segm if d['image_id'] == r['img_id']]
        for got, ref in zip(masks, p['masks']):  # DumpDetResults keeps masks as RLE
            assert (mask_util.decode(got) == mask_util.decode(ref)).all()
    for kind, key in (('bbox', 'coco/bbox_mAP'), ('segm', 'coco/segm_mAP')):
        dt = gt.loadRes(str(sub / f'results.{kind}.json'))
        ev = COCOeval(gt, dt, kind)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
        assert round(ev.stats[0], 3) == pytest.approx(scored[key], abs=1e-3), kind


def _write_cfg(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_format_only_ade20k_pngs_in_server_encoding(tmp_path, demo):
    """With reduce_zero_label (ADE20K) the PNGs hold the raw predictions + 1, i.e. 1..num_classes, one per test image,
    named after it; the test images need no label maps."""
    ade = demo['root'] / 'ade'
    cfg = _write_cfg(tmp_path / 'ade_test.py', f'''
_base_ = [{SEG!r}]
metainfo = dict(classes=('circle', 'rectangle', 'triangle'), palette=[[220, 20, 60], [0, 160, 0], [30, 60, 230]])
model = dict(decode_head=dict(num_classes=3))
test_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(
    data_root={str(ade)!r}, metainfo=metainfo, reduce_zero_label=True,
    data_prefix=dict(img_path='images/validation', seg_map_path='')))
''')
    sub, pkl = tmp_path / 'pngs', tmp_path / 'raw.pkl'
    assert _tool('test').main([cfg, demo['seg3'], '--work-dir', str(tmp_path / 'w'), '--format-only', '--out-dir',
                               str(sub), '--out', str(pkl)]) == 0
    raw = {Path(r['img_path']).stem: r for r in pickle.loads(pkl.read_bytes())}
    images = sorted(p.stem for p in (ade / 'images/validation').iterdir())
    assert sorted(p.stem for p in sub.iterdir()) == images == sorted(raw)
    seen = set()
    for name in images:
        png = cv2.imread(str(sub / f'{name}.png'), cv2.IMREAD_UNCHANGED)
        pred = raw[name]['pred_sem_seg']['data'].squeeze(0).numpy()
        assert png.dtype == np.uint8 and png.shape == cv2.imread(str(ade / f'images/validation/{name}.png')).shape[:2]
        assert (png == pred + 1).all()
        seen |= set(np.unique(png).tolist())
    assert seen <= {1, 2, 3} and seen


def test_format_only_refuses_other_metrics(tmp_path, demo, capsys):
    rc = _tool('test').main([DET, demo['det'], '--work-dir', str(tmp_path), '--format-only', '--out-dir',
                             str(tmp_path / 'o'), '--cfg-options', *det_opts(demo), 'test_evaluator.type=VOCMetric'])
    assert rc == 2 and "'VOCMetric'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _tool('test').parse_args([DET, demo['det'], '--format-only'])  # no --out-dir
    rc = _tool('test').main([DET, demo['det'], '--out', str(tmp_path / 'x.json'), '--cfg-options', *det_opts(demo)])
    assert rc == 2 and '.pkl' in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ --show-dir
def _run(*args, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, 'OMP_NUM_THREADS': '1'})


@pytest.mark.parametrize('kind', ['det', 'seg'])
def test_show_dir_draws_every_image(tmp_path, demo, kind):
    """One drawing per test image, for the demo detector (mmdet's hook) and the demo segmentor, whose config has no
    visualisation hook (mmseg's is added). Own process: mmengine's visualizer is a process-wide instance."""
    cfg, opts = (DET, det_opts(demo)) if kind == 'det' else (SEG, seg_opts(demo))
    show = tmp_path / 'show'
    out = _run('tools/test.py', cfg, demo[kind], '--work-dir', str(tmp_path / 'w'), '--show-dir', str(show),
               '--cfg-options', *opts)
    assert out.returncode == 0, out.stderr[-3000:]
    pngs = sorted(show.glob('*.png'))
    assert len(pngs) == NUM_VAL, (pngs, out.stdout[-2000:])
    src = sorted((demo['root'] / ('coco/val' if kind == 'det' else 'ade/images/validation')).iterdir())
    for png, img in zip(pngs, src):
        drawn, src_img = cv2.imread(str(png)), cv2.imread(str(img))
        # mmdet draws ground truth | prediction side by side, mmseg the prediction over the image
        assert drawn.shape[0] == src_img.shape[0] and drawn.shape[1] in (src_img.shape[1], 2 * src_img.shape[1])
        assert png.stem == img.stem
    assert str(show) in out.stdout


def test_show_dir_config_of_shipped_ade20k_config_builds(tmp_path):
    """The shipped ADE20K configs carry mmseg's SegVisualizationHook (which has no img_out_dir): the show-dir hook
    replaces it and builds."""
    from mmengine.config import Config
    from mmengine.registry import HOOKS, init_default_scope
    from mmseg.registry import VISUALIZERS

    import mmplugin  # noqa: F401
    from mmplugin.cli.evaluation import configure_show_dir
    cfg = Config.fromfile(str(ROOT / 'configs/swin/swin_t_upernet_160k_ade20k.py'))
    assert cfg.default_hooks.visualization.type == 'SegVisualizationHook'
    assert configure_show_dir(cfg, str(tmp_path / 'show')) == str(tmp_path / 'show')
    init_default_scope('mmseg')
    VISUALIZERS.build(dict(cfg.visualizer, name='show_dir_check'))  # the hook draws with the visualizer
    hook = HOOKS.build(cfg.default_hooks.visualization)
    assert hook.draw is True and hook.out_dir == str(tmp_path / 'show')


# ------------------------------------------------------------------------------------------------------------ --tta
def _tta_cfg(tmp_path: Path, scales, flips) -> str:
    flip = ', '.join(f'dict(type="RandomFlip", prob={p})' for p in flips)
    return _write_cfg(tmp_path / f'tta_{len(scales)}_{len(flips)}.py', f'''
_base_ = [{DET!r}, 'mmplugin::_base_/det_tta.py']
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=s, keep_ratio=True) for s in {list(scales)!r}],
        [{flip}],
        [dict(type='LoadAnnotations', with_bbox=True, with_mask=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                                               'flip', 'flip_direction'))]])]
''')


def test_tta_on_the_demo_detector(tmp_path, demo, capsys):
    """--tta with the shared piece: one view (192 px, no flip) reproduces the plain test exactly (NMS at the
    detector's own threshold keeps its detections); 2 scales x 2 flips gives boxes and masks (segm AP)."""
    test = _tool('test')
    assert test.main([DET, demo['det'], '--work-dir', str(tmp_path / 'a'), '--cfg-options', *det_opts(demo)]) == 0
    plain = _metrics(capsys.readouterr().out)
    one = _tta_cfg(tmp_path, [(192, 192)], [0.])
    assert test.main([one, demo['det'], '--tta', '--work-dir', str(tmp_path / 'b'),
                      '--cfg-options', *det_opts(demo)]) == 0
    assert _metrics(capsys.readouterr().out) == plain
    four = _tta_cfg(tmp_path, [(160, 160), (224, 224)], [1., 0.])
    pkl = tmp_path / 'tta.pkl'
    assert test.main([four, demo['det'], '--tta', '--out', str(pkl), '--work-dir', str(tmp_path / 'c'),
                      '--cfg-options', *det_opts(demo)]) == 0
    got = _metrics(capsys.readouterr().out)
    assert {'coco/bbox_mAP', 'coco/segm_mAP'} <= set(got)
    for r in pickle.loads(pkl.read_bytes()):
        p = r['pred_instances']
        assert len(p['masks']) == len(p['scores']) > 0 and tuple(p['masks'][0]['size']) == r['ori_shape']


def _views(seed=0, n=40, hw=(48, 64)):
    """Two views of one image (not flipped / flipped horizontally) with random boxes, scores, labels and masks."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(seed)
    views = []
    for flip in (False, True):
        xy = torch.rand(n, 2, generator=g) * torch.tensor([hw[1] - 10., hw[0] - 10.])
        wh = torch.rand(n, 2, generator=g) * 20 + 2
        inst = InstanceData(bboxes=torch.cat([xy, (xy + wh).clamp(max=torch.tensor([hw[1], hw[0]]))], 1),
                            scores=torch.rand(n, generator=g), labels=torch.randint(0, 3, (n, ), generator=g),
                            masks=torch.rand(n, *hw, generator=g) > 0.5)
        views.append(DetDataSample(pred_instances=inst, metainfo=dict(ori_shape=hw, flip=flip,
                                                                      flip_direction='horizontal' if flip else None)))
    return views


@pytest.mark.parametrize('nms', ['nms', 'soft_nms'])
def test_mask_tta_model_merges_as_mmdet_and_keeps_masks(nms):
    """Boxes, scores, labels equal mmdet's DetTTAModel (on the same views without masks); each kept mask is its
    source view's mask, un-flipped."""
    import copy

    from mmdet.models.test_time_augs import DetTTAModel
    from mmengine.config import ConfigDict

    from mmplugin.models import MaskDetTTAModel
    tta_cfg = ConfigDict(nms=dict(type=nms, iou_threshold=0.5), max_per_img=25)
    views = _views()
    boxes_only = copy.deepcopy(views)  # mmdet 3.3's DetTTAModel refuses views with masks
    for v in boxes_only:
        del v.pred_instances.masks

    class Detector(torch.nn.Module):  # only the merging is exercised
        def test_step(self, data):
            raise AssertionError('not called')
    ref = DetTTAModel(module=Detector(), tta_cfg=tta_cfg)._merge_single_sample(boxes_only)
    got = MaskDetTTAModel(module=Detector(), tta_cfg=tta_cfg).merge_preds([copy.deepcopy(views)])[0]
    r, p = ref.pred_instances, got.pred_instances
    assert len(p) == 25
    assert torch.equal(p.bboxes, r.bboxes) and torch.equal(p.scores, r.scores) and torch.equal(p.labels, r.labels)
    w = views[0].metainfo['ori_shape'][1]
    sources = [(views[0].pred_instances.bboxes[i], views[0].pred_instances.masks[i].numpy())
               for i in range(40)]
    for i in range(40):
        b = views[1].pred_instances.bboxes[i]
        unflipped = torch.stack([w - b[2], b[1], w - b[0], b[3]])
        sources.append((unflipped, np.flip(views[1].pred_instances.masks[i].numpy(), axis=1)))
    for box, mask in zip(p.bboxes, p.masks):
        match = [m for b, m in sources if torch.allclose(b, box)]
        assert len(match) == 1 and (mask.numpy() == match[0]).all()


def test_tta_missing_says_what_to_add(tmp_path, demo, capsys):
    test = _tool('test')
    assert test.main([DET, demo['det'], '--tta', '--cfg-options', *det_opts(demo)]) == 2
    assert 'mmplugin::_base_/det_tta.py' in capsys.readouterr().err
    assert test.main([SEG, demo['seg'], '--tta', '--cfg-options', *seg_opts(demo)]) == 2
    assert "SegTTAModel" in capsys.readouterr().err


@pytest.mark.parametrize('config', ['swin/swin_b_htcpp_6x_coco.py', 'swin/swin_l_htcpp_6x_coco.py',
                                    'swin/swin_l_htcpp_nosemantic_6x_coco.py'])
def test_htcpp_configs_test_at_twelve_views(config):
    """The HTC++ configs' TTA: 6 shorter sides 600-1600 (longer side <= 3000) x flip, soft-NMS, masks kept."""
    from mmdet.registry import TRANSFORMS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmplugin  # noqa: F401
    from mmplugin.cli.evaluation import configure_tta
    cfg = Config.fromfile(str(ROOT / 'configs' / config))
    assert cfg.tta_model.type == 'mmplugin.MaskDetTTAModel' and cfg.tta_model.tta_cfg.nms.type == 'soft_nms'
    configure_tta(cfg)
    assert cfg.model.type == 'mmplugin.MaskDetTTAModel' and cfg.model.module.type == 'HybridTaskCascade'
    init_default_scope('mmdet')
    tta = TRANSFORMS.build(cfg.test_dataloader.dataset.pipeline[1])
    img = np.zeros((480, 640, 3), np.uint8)
    views = tta(dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2], img_id=0, img_path='x.jpg',
                     gt_bboxes=np.zeros((0, 4), np.float32), gt_bboxes_labels=np.zeros(0, np.int64),
                     gt_ignore_flags=np.zeros(0, bool)))
    shapes = [s.img_shape for s in views['data_samples']]
    flips = [s.flip for s in views['data_samples']]
    assert len(shapes) == 12 and sorted({min(s) for s in shapes}) == [600, 800, 1000, 1200, 1400, 1600]
    assert flips.count(True) == 6


# ------------------------------------------------------------------------------------------ infer.py --pred-out
def test_infer_pred_out_is_det_inferencer_format(tmp_path, demo, capsys):
    """The json holds mmdet DetInferencer's per-image dict for the same model and image, plus img_path."""
    from mmdet.apis import DetInferencer
    img = str(demo['root'] / 'coco/val/val_00000.png')
    js = tmp_path / 'p.json'
    assert _tool('infer').main([DET, demo['det'], img, '--pred-out', str(js), '--out', str(tmp_path / 'a.png')]) == 0
    got = json.loads(js.read_text())
    assert got['classes'] == list(CLASSES) and len(got['predictions']) == 1
    pred = got['predictions'][0]
    ref = DetInferencer(model=DET, weights=demo['det'], device='cpu', show_progress=False)(
        img, no_save_pred=True, return_vis=False)['predictions'][0]
    assert pred.pop('img_path') == img and set(pred) == set(ref) == {'bboxes', 'labels', 'scores', 'masks'}
    # the same model and image through two code paths: the same float32 operations, so only the json's float
    # formatting separates them (~1e-7 relative); 1e-6 on scores in [0, 1], 1e-3 px on boxes of a 192 px image
    assert pred['labels'] == ref['labels'] and np.allclose(pred['scores'], ref['scores'], atol=1e-6)
    assert np.allclose(pred['bboxes'], ref['bboxes'], atol=1e-3)
    assert [m['counts'] for m in pred['masks']] == [m['counts'] for m in ref['masks']]
    assert cv2.imread(str(tmp_path / 'a.png')).shape == cv2.imread(img).shape
    # --cfg-options reaches the model: at most 2 detections per image
    assert _tool('infer').main([DET, demo['det'], img, '--pred-out', str(js), '--no-draw',
                                '--cfg-options', 'model.test_cfg.rcnn.max_per_img=2']) == 0
    few = json.loads(js.read_text())['predictions'][0]
    assert len(few['scores']) == 2 < len(ref['scores']) and few['scores'] == pred['scores'][:2]


def test_infer_folder_segmentor_label_maps(tmp_path, demo):
    """A folder of images: one drawing and one label map per image; the maps equal mmseg's inference_model."""
    from mmengine.config import Config
    from mmseg.apis import inference_model, init_model
    folder = demo['root'] / 'ade/images/validation'
    js, vis = tmp_path / 'seg.json', tmp_path / 'vis'
    assert _tool('infer').main([SEG, demo['seg'], str(folder), '--pred-out', str(js), '--out', str(vis)]) == 0
    got = json.loads(js.read_text())
    images = sorted(folder.iterdir())
    assert [p['img_path'] for p in got['predictions']] == [str(p) for p in images]
    assert got['classes'] == ['background', *CLASSES]
    assert sorted(p.name for p in vis.iterdir()) == [p.name for p in images]
    model = init_model(Config.fromfile(SEG), demo['seg'], device='cpu')
    for rec, img in zip(got['predictions'], images):
        assert rec['sem_seg_path'] == str(tmp_path / 'seg' / img.name)
        label = cv2.imread(rec['sem_seg_path'], cv2.IMREAD_UNCHANGED)
        ref = inference_model(model, str(img)).pred_sem_seg.data.squeeze(0).numpy()
        assert label.dtype == np.uint8 and (label == ref).all() and label.max() <= 3


def test_infer_refuses_json_drawing(tmp_path, demo, capsys):
    img = str(demo['root'] / 'coco/val/val_00000.png')
    assert _tool('infer').main([DET, demo['det'], img, '--out', str(tmp_path / 'x.json')]) == 2
    err = capsys.readouterr().err
    assert '--pred-out' in err and 'Traceback' not in err
    assert _tool('infer').main([DET, demo['det'], str(tmp_path / 'empty_dir_missing')]) == 2
    assert 'not found' in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- dataset class names
def test_class_names_matching_no_category_are_refused(tmp_path, demo, capsys):
    """The worked example with only num_classes changed (COCO's 80 names) on the 3-class demo data stops with a
    message before any model is built; with its class names replaced by the demo's it passes, and the head follows."""
    from mmdet.datasets import CocoDataset
    from mmengine.config import Config

    import mmplugin  # noqa: F401
    from mmplugin.cli.datasets import DatasetClassesError, check_datasets
    example = ROOT / 'configs/custom/swiftformer_l1_retinanet_1x_coco.py'
    coco = demo['root'] / 'coco'
    opts = {}
    for split, ann in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        opts.update({f'{split}_dataloader.dataset.data_root': f'{coco}/',
                     f'{split}_dataloader.dataset.ann_file': f'annotations/instances_{ann}.json',
                     f'{split}_dataloader.dataset.data_prefix.img': f'{ann}/'})
    base = Config.fromfile(str(example))
    assert tuple(base.metainfo.classes) == CocoDataset.METAINFO['classes'] and base.model.bbox_head.num_classes == 80
    assert all(base[f'{s}_dataloader'].dataset.metainfo == base.metainfo for s in ('train', 'val', 'test'))
    base.merge_from_dict({**opts, 'model.bbox_head.num_classes': 3})
    with pytest.raises(DatasetClassesError) as err:
        check_datasets(base, splits=('train', ))
    msg = str(err.value)
    assert 'instances_train.json' in msg and "'circle'" in msg and "'person'" in msg and 'metainfo' in msg
    rc = _tool('train').main([str(example), '--work-dir', str(tmp_path / 'w'),
                              '--cfg-options', *[f'{k}={v}' for k, v in opts.items()]])
    out = capsys.readouterr()
    assert rc == 2 and 'match none of' in out.err and 'SwiftFormer' not in out.out
    text = example.read_text()
    start = text.index('classes = (')
    own = tmp_path / 'own.py'
    own.write_text(text[:start] + f'classes = {CLASSES!r}\n' + text[text.index("metainfo = dict"):])
    fixed = Config.fromfile(str(own))
    fixed.merge_from_dict(opts)
    assert fixed.model.bbox_head.num_classes == 3
    check_datasets(fixed)  # nothing raised


def test_annotation_categories_of_a_large_file_from_its_tail(tmp_path, monkeypatch):
    import mmplugin.cli.datasets as datasets
    data = {'images': [{'id': i, 'file_name': f'{i:08d}.jpg'} for i in range(3000)], 'annotations': [],
            'categories': [{'id': 1, 'name': 'cat'}, {'id': 2, 'name': 'dog'}]}
    path = tmp_path / 'a.json'
    path.write_text(json.dumps(data))
    assert datasets.annotation_categories(str(path)) == ['cat', 'dog']
    monkeypatch.setattr(datasets, '_WHOLE_FILE_LIMIT', 1000)
    monkeypatch.setattr(datasets, '_TAIL_BYTES', 2000)
    assert datasets.annotation_categories(str(path)) == ['cat', 'dog']  # read from the last 2000 bytes


# ------------------------------------------------------------------ the first hour: nothing lost, one-line errors
def test_infer_keeps_the_label_map_beside_the_drawing(tmp_path, demo, monkeypatch):
    """``--out result.png --pred-out result.json`` (the README's line) on a segmentor: the drawing, the json and
    the label map are three files; the json points at the label map, which holds mmseg's prediction."""
    from mmengine.config import Config
    from mmseg.apis import inference_model, init_model
    img = str(sorted((demo['root'] / 'ade/images/validation').iterdir())[0])
    monkeypatch.chdir(tmp_path)
    for args in (['--out', 'result.png', '--pred-out', 'result.json'], ['--pred-out', 'result.json']):
        for p in tmp_path.iterdir():
            p.unlink()
        assert _tool('infer').main([SEG, demo['seg'], img, *args]) == 0
        rec = json.loads((tmp_path / 'result.json').read_text())['predictions'][0]
        assert rec['sem_seg_path'] == 'result_labels.png'
        assert sorted(p.name for p in tmp_path.iterdir()) == ['result.json', 'result.png', 'result_labels.png']
        label = cv2.imread('result_labels.png', cv2.IMREAD_UNCHANGED)
        drawing = cv2.imread('result.png', cv2.IMREAD_UNCHANGED)
        assert label.ndim == 2 and drawing.ndim == 3
    model = init_model(Config.fromfile(SEG), demo['seg'], device='cpu')
    assert (label == inference_model(model, img).pred_sem_seg.data.squeeze(0).numpy()).all()


@pytest.mark.parametrize('case', ['labels-file', 'labels-folder', 'json'])
def test_infer_refuses_outputs_that_overwrite_each_other(tmp_path, demo, capsys, case):
    """Every pairing of --out with what --pred-out writes: a drawing path equal to the label map (one image), the
    label-map folder (a folder of images) or the json is refused with rc 2 and one line, before anything runs."""
    folder = demo['root'] / 'ade/images/validation'
    image = str(sorted(folder.iterdir())[0])
    js = tmp_path / 'p.json'
    source, out = {'labels-file': (image, tmp_path / 'p_labels.png'), 'labels-folder': (str(folder), tmp_path / 'p'),
                   'json': (image, js)}[case]
    assert _tool('infer').main([SEG, demo['seg'], source, '--out', str(out), '--pred-out', str(js)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and ('overwrite' in err[0] or 'not ' in err[0]), err
    assert not js.exists()


@pytest.mark.parametrize('case', ['out=out-dir', 'out=show-dir', 'out-dir=show-dir'])
def test_test_tool_refuses_outputs_that_overwrite_each_other(tmp_path, demo, capsys, case):
    """tools/test.py: --out equal to --out-dir or --show-dir, and a segmentor's --out-dir equal to --show-dir (label
    maps and drawings share the image names), are refused with rc 2 and one line; distinct folders run."""
    d = str(tmp_path / 'x.pkl')
    opts = {'out=out-dir': ['--out', d, '--format-only', '--out-dir', d],
            'out=show-dir': ['--out', d, '--show-dir', d],
            'out-dir=show-dir': ['--format-only', '--out-dir', d, '--show-dir', d]}[case]
    assert _tool('test').main([SEG, demo['seg'], *opts, '--cfg-options', *seg_opts(demo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and 'same' in err[0], err


def test_neck_that_does_not_fit_the_backbone_is_the_configs_mistake(tmp_path, demo, capsys):
    """A neck whose in_channels do not match the backbone (wrong count from out_indices, wrong values from another
    arch) stops train / test / infer with one line naming both lists and the fix, before any data or checkpoint is
    read (test.py used to blame the checkpoint, train.py ended in a bare AssertionError / a convolution error)."""
    img = str(demo['root'] / 'coco/val/val_00000.png')
    cases = [(['model.backbone.out_indices=(1,2,3)'], '[48, 56, 112, 220]', '[56, 112, 220]'),
             (['model.backbone.arch=s'], '[48, 56, 112, 220]', '[48, 64, 168, 224]')]
    for opts, want, got in cases:
        for tool, args in (('train', [DET, '--work-dir', str(tmp_path)]), ('test', [DET, demo['det']]),
                           ('infer', [DET, demo['det'], img])):
            assert _tool(tool).main([*args, '--cfg-options', *opts]) == 2, tool
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f'in_channels is {want}' in err[0] and f'gives {got}' in err[0], (tool, err)
            assert f'model.neck.in_channels={got}' in err[0] and 'checkpoint' not in err[0]


def test_unreadable_images_are_one_line(tmp_path, demo, capsys):
    """A file that is not an image (alone or inside a folder) and an empty file: rc 2, one line naming the file,
    before the model is built (mmcv ended in a 35-line traceback, 'failed to load image')."""
    bad = tmp_path / 'notimage.jpg'
    bad.write_text('hello')
    empty = tmp_path / 'empty.png'
    empty.write_bytes(b'')
    folder = tmp_path / 'imgs'
    folder.mkdir()
    (folder / 'a.png').write_bytes((demo['root'] / 'coco/val/val_00000.png').read_bytes())
    (folder / 'b.jpg').write_text('not a jpeg')
    for source, name in ((bad, 'notimage.jpg'), (empty, 'empty.png'), (folder, 'b.jpg')):
        assert _tool('infer').main([DET, demo['det'], str(source)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and 'not an image' in err[0], err


def test_cfg_options_mistakes_are_one_line(tmp_path, demo, capsys):
    """--cfg-options without '=' and a top-level key that exists nowhere (``test_dataloder``): rc 2, one line with
    the nearest existing key; a misspelled nested key whose sibling is close (``model.backbon``) too; a new key
    inside an existing part passes, and ``+KEY=VALUE`` marks any key as new on purpose."""
    from mmplugin.apis import load_config
    for opt, expect in (('model.backbone.arch', 'expected KEY=VALUE'),
                        ('test_dataloder.batch_size=2', "did you mean 'test_dataloader'?"),
                        ('model.backbon.arch=s', "did you mean 'model.backbone'?")):
        assert _tool('test').main([DET, demo['det'], '--cfg-options', opt]) == 2, opt
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expect in err[0], err
    cfg = load_config(DET, {'model.backbone.with_cp': True, '+my_extra.value': 3})
    assert cfg.model.backbone.with_cp is True and cfg.my_extra.value == 3


def test_missing_config_names_the_nearest(capsys):
    """A config path one letter off: rc 2, one line naming the existing config(s) nearest to it."""
    assert _tool('test').main(['configs/swiftformer_xs_maskrcnn_shape.py', 'x.pth']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'configs/demo/swiftformer_xs_maskrcnn_shapes.py' in err[0], err


def test_environment_dump_goes_to_the_log_file(tmp_path, demo, capsys):
    """A mistake found while the runner is built comes right after one line naming the log file: mmengine's ~480
    lines of environment and config are in that file, not on the console."""
    opts = [*det_opts(demo), 'model.roi_head.bbox_head.type=Shared2FCBBoxHeadd']
    assert _tool('test').main([DET, demo['det'], '--work-dir', str(tmp_path), '--cfg-options', *opts]) == 2
    out, err = capsys.readouterr()
    assert 'System environment' not in out + err and 'Config:' not in out + err
    log = [ln for ln in out.splitlines() if ln.startswith('environment and config: ')]
    assert len(log) == 1 and 'System environment' in Path(log[0].split(': ', 1)[1]).read_text()
    errors = [ln for ln in err.splitlines() if ln.startswith('error: ')]
    assert len(errors) == 1 and 'Shared2FCBBoxHead' in errors[0], err


def test_custom_template_without_data_speaks_of_the_users_data(capsys):
    """The custom-data template with no data: the missing files, where the template's paths are set, and a fix that
    names every key holding the location (the evaluators' ann_file too); no COCO 2017 download instructions."""
    assert _tool('train').main([str(ROOT / 'configs/custom/swiftformer_l1_maskrcnn_20k_coco_format.py')]) == 2
    err = capsys.readouterr().err
    assert 'data/my_coco/annotations/instances_train.json' in err and 'COCO 2017' not in err
    assert 'top of the config' in err and 'val_evaluator.ann_file=FILE' in err


def test_messages_point_at_sections_that_exist():
    """Every 'docs/X.md, "Section"' / 'README, "Section"' a message or docstring of the package names is a heading
    of that file."""
    import re
    pattern = re.compile(r'(README|docs/[\w]+\.md)[,:]?\s*\(?["\u201c]([^"\u201d]+)["\u201d]')
    seen = 0
    for path in (ROOT / 'mmplugin').rglob('*.py'):
        text = re.sub(r"'\s*\n\s*'", '', path.read_text())  # join implicitly concatenated string literals
        for doc, section in pattern.findall(text):
            section = ' '.join(section.replace('#', ' ').split())  # a section name wrapped over comment lines
            target = ROOT / ('README.md' if doc == 'README' else doc)
            assert target.is_file(), (path, doc)
            headings = [h.lstrip('#').strip() for h in target.read_text().splitlines() if h.startswith('#')]
            assert any(h.startswith(section.rstrip('.')) for h in headings), (path.name, doc, section)
            seen += 1
    assert seen >= 3


def test_a_tool_start_is_free_of_third_party_noise():
    """A tool run in a fresh process whose first mistake is found after mmengine, mmcv and mmdet are imported
    prints exactly its one error line (no 'pkg_resources is deprecated' warnings before it)."""
    out = subprocess.run([sys.executable, 'tools/test.py', DET, 'missing.pth'], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ['error: checkpoint file not found: missing.pth'], out.stderr


def test_training_on_a_loaded_machine_says_so(tmp_path, demo, capsys, monkeypatch):
    """tools/train.py on a CPU whose cores are taken by other work warns before the first iteration that training
    runs slower than on an idle machine and that mmengine's ETA assumes the first iterations' speed."""
    monkeypatch.setattr(os, 'getloadavg', lambda: (os.cpu_count() + 4.0, 0.0, 0.0))
    sub = demo['root'] / 'ade'
    opts = [f'train_dataloader.dataset.data_root={sub}', f'val_dataloader.dataset.data_root={sub}',
            f'test_dataloader.dataset.data_root={sub}', 'train_cfg.max_iters=1', 'train_cfg.val_interval=100',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False']
    assert _tool('train').main([SEG, '--work-dir', str(tmp_path), '--cfg-options', *opts]) == 0
    err = capsys.readouterr().err
    assert 'the machine is loaded' in err and "mmengine's ETA" in err


def test_model_index_lists_without_openmim(capsys):
    """``python -m mmplugin.zoo`` (the README's way to list the model index without openmim): one line per model,
    filtered by words; every docs file a package message names exists."""
    import re

    from mmplugin.zoo import load_models, main
    assert main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(load_models()) + 1 and lines[-1].endswith('models')
    assert main(['swinv2', 'cascade']) == 0
    rows = capsys.readouterr().out.strip().splitlines()[:-1]
    assert rows and all('swinv2' in r and 'cascade' in r for r in rows)
    assert 'python -m mmplugin.zoo' in (ROOT / 'README.md').read_text()
    for path in (ROOT / 'mmplugin').rglob('*.py'):
        for doc in set(re.findall(r'docs/\w+\.md', path.read_text())):
            assert (ROOT / doc).is_file(), (path.name, doc)


def test_wiring_check_reads_each_kind_of_consumer():
    """check_model_wiring against the channels the backbone really returns: an FPN-style neck (every level in
    order) and a segmentor's decode head at its explicit in_index (no neck), accepted when right and refused with
    both lists when wrong; necks that pick or reorder levels and heads without in_index are not judged."""
    from mmengine.config import Config

    from mmplugin.apis import ConfigWiringError, check_model_wiring
    bb = dict(type='mmplugin.SwiftFormer', arch='xs', init_cfg=None)
    good = [dict(backbone=bb, neck=dict(type='FPN', in_channels=[48, 56, 112, 220], out_channels=8, num_outs=4)),
            dict(backbone={**bb, 'out_indices': (3, )}, neck=dict(type='DilatedEncoder', in_channels=220)),
            # necks that pick or reorder levels are left to mmdet (YOLOv3's neck reads them deepest first)
            dict(backbone=bb, neck=dict(type='YOLOV3Neck', in_channels=[220, 112, 56], out_channels=[8, 8, 8])),
            dict(backbone={**bb, 'out_indices': (3, )}, neck=dict(type='DilatedEncoder', in_channels=2048)),
            dict(backbone=bb, decode_head=dict(type='Mask2FormerHead', in_channels=[1, 2])),  # no in_index
            dict(backbone=bb, decode_head=dict(type='FCNHead', in_channels=112, in_index=2)),
            dict(backbone=bb, decode_head=dict(type='UPerHead', in_channels=[48, 56, 112, 220], in_index=[0, 1, 2, 3]))]
    for model in good:
        check_model_wiring(Config(dict(model=model, default_scope='mmdet')))
    bad = [(dict(backbone=bb, decode_head=dict(type='FCNHead', in_channels=220, in_index=2)), '112'),
           (dict(backbone=bb, neck=[dict(type='FPN', in_channels=[48, 56, 112], out_channels=8, num_outs=4)]),
            '[48, 56, 112, 220]')]
    for model, got in bad:
        with pytest.raises(ConfigWiringError, match=re.escape(f'gives {got}')):
            check_model_wiring(Config(dict(model=model, default_scope='mmdet')))
