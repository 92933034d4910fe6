"""The evaluation options of tools/test.py, applied to an mmengine config (and to the built runner where mmengine
gives no config hook): test-server submission files, raw prediction dumps, drawn predictions, test-time augmentation.

Every function raises :class:`TestOptionError` with a message naming what to change when the config cannot do what
the option asks; none of them ignores an option silently.
"""
from __future__ import annotations

import copy
import os
import os.path as osp

from mmplugin.utils.errors import UserError

__all__ = ['TestOptionError', 'configure_format_only', 'configure_show_dir', 'configure_tta', 'check_dump_path',
           'add_dump_metric',
           'is_segmentor_cfg', 'TTA_HINT_DET', 'TTA_HINT_SEG']

TTA_HINT_DET = ("add the shared piece to the config's bases: _base_ = [..., 'mmplugin::_base_/det_tta.py'] "
                "(multi-scale + flip, boxes and masks; configs/_base_/det_tta.py), or define tta_model "
                "(e.g. dict(type='mmplugin.MaskDetTTAModel', tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), "
                "max_per_img=100))) and tta_pipeline (LoadImageFromFile, then TestTimeAug over Resize scales x "
                "RandomFlip prob 1 / 0, then PackDetInputs with the 'flip' and 'flip_direction' meta keys)")
TTA_HINT_SEG = ("add mmseg's standard pair: tta_model = dict(type='SegTTAModel') and the tta_pipeline of "
                "mmseg::_base_/datasets/ade20k.py (LoadImageFromFile, then TestTimeAug over Resize scale_factor "
                "0.5-1.75 x RandomFlip prob 0 / 1, LoadAnnotations, PackSegInputs), e.g. by inheriting "
                "'mmseg::_base_/datasets/ade20k.py' or copying its tta_pipeline with your image scale")


class TestOptionError(UserError, ValueError):
    """A command-line evaluation option that the config cannot honour; the message says what to change."""


def is_segmentor_cfg(cfg) -> bool:
    """Whether ``cfg`` is an mmseg config (its default scope, else its model type)."""
    scope = cfg.get('default_scope')
    if scope:
        return scope == 'mmseg'
    return 'Segmentor' in str(cfg.model.get('type', ''))


def _metrics(cfg_evaluator):
    """The metric dicts of ``test_evaluator`` (a dict, a list of dicts, or an Evaluator dict with ``metrics``)."""
    if isinstance(cfg_evaluator, dict) and 'metrics' in cfg_evaluator:
        cfg_evaluator = cfg_evaluator['metrics']
    return list(cfg_evaluator) if isinstance(cfg_evaluator, (list, tuple)) else [cfg_evaluator]


def _drop_annotation_loading(pipeline: list) -> list:
    """``pipeline`` without ``LoadAnnotations`` (also inside ``TestTimeAug``): test images have no label maps."""
    out = []
    for t in pipeline:
        if str(t.get('type', '')).endswith('LoadAnnotations'):
            continue
        if t.get('type') == 'TestTimeAug':
            t = dict(t, transforms=[[s for s in stage if not str(s.get('type', '')).endswith('LoadAnnotations')]
                                    for stage in t['transforms']])
            t['transforms'] = [stage for stage in t['transforms'] if stage]
        out.append(t)
    return out


def configure_format_only(cfg, out_dir: str) -> list[str]:
    """Make ``test_evaluator`` write test-server files into ``out_dir`` instead of scoring.

    * ``CocoMetric`` (mmdet): ``format_only=True``, ``outfile_prefix=out_dir/results``, so ``results.bbox.json``
      (and ``results.segm.json`` when ``'segm'`` is among the metrics) in the COCO results format that the COCO
      server and ``pycocotools.COCO.loadRes`` read. The config's ``ann_file`` only has to list the images and the
      categories (``image_info_test-dev2017.json`` for test-dev).
    * ``IoUMetric`` (mmseg): ``format_only=True``, ``output_dir=out_dir``: one PNG label map per image, named after
      the image. With ``reduce_zero_label=True`` (ADE20K) mmseg adds 1 back, so the maps hold the dataset's own
      labels 1..150, the encoding the ADE20K server expects. The test pipeline's ``LoadAnnotations`` is dropped:
      test images have no label maps.

    Returns the paths that will be written (the json files; the PNG folder). Raises :class:`TestOptionError` for
    any other metric type.
    """
    out_dir = osp.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    metrics = _metrics(cfg.test_evaluator)
    for metric in metrics:
        kind = str(metric.get('type', '')).split('.')[-1]
        if kind == 'CocoMetric':
            metric['format_only'] = True
            metric['outfile_prefix'] = osp.join(out_dir, 'results')
            wanted = metric.get('metric', 'bbox')
            wanted = [wanted] if isinstance(wanted, str) else list(wanted)
            unsupported = [m for m in wanted if m not in ('bbox', 'segm')]
            if unsupported:
                raise TestOptionError(f'--format-only writes bbox / segm results; the CocoMetric also asks for '
                                      f'{unsupported}: remove them with --cfg-options test_evaluator.metric=...')
            written += [osp.join(out_dir, f'results.{m}.json') for m in wanted]
        elif kind == 'IoUMetric':
            metric['format_only'] = True
            metric['output_dir'] = out_dir
            written.append(out_dir + os.sep)
        else:
            raise TestOptionError(f'--format-only knows mmdet\'s CocoMetric and mmseg\'s IoUMetric; the config\'s '
                                  f'test_evaluator is {metric.get("type")!r}')
    if is_segmentor_cfg(cfg):
        ds = cfg.test_dataloader.dataset
        while 'dataset' in ds and 'pipeline' not in ds:  # dataset wrappers
            ds = ds.dataset
        ds.pipeline = _drop_annotation_loading(ds.pipeline)
        if cfg.get('tta_pipeline'):
            cfg.tta_pipeline = _drop_annotation_loading(cfg.tta_pipeline)
    return written


def configure_show_dir(cfg, show_dir: str) -> str:
    """Draw every test prediction into ``show_dir`` (resolved against the current directory), one file per image
    named after it, for detectors and segmentors alike; returns the folder.

    Detectors: mmdet's ``DetVisualizationHook`` (added when the config has none) with ``test_out_dir``.
    Segmentors: :class:`mmplugin.engine.seg_test_vis.SegTestVisualizationHook` in place of mmseg's
    ``SegVisualizationHook`` (whose test drawing has no folder keyword, skips all but every ``interval``-th batch and
    needs the training dataloader), keeping its ``wait_time`` / ``backend_args``; nothing is shown on screen.
    """
    show_dir = osp.abspath(show_dir)
    seg = is_segmentor_cfg(cfg)
    if not cfg.get('default_hooks'):
        cfg.default_hooks = {}
    hooks = cfg.default_hooks
    old = dict(hooks.get('visualization') or {})
    if seg:
        keep = {k: old[k] for k in ('wait_time', 'backend_args') if k in old}
        hooks['visualization'] = dict(type='mmplugin.SegTestVisualizationHook', out_dir=show_dir, show=False, **keep)
        if not cfg.get('visualizer'):
            cfg.visualizer = dict(type='SegLocalVisualizer', vis_backends=[dict(type='LocalVisBackend')])
        return show_dir
    if not old:
        old = dict(type='DetVisualizationHook')
    old.update(draw=True, show=False, test_out_dir=show_dir)  # absolute: mmdet's join with work_dir keeps it
    hooks['visualization'] = old
    if not cfg.get('visualizer'):
        cfg.visualizer = dict(type='DetLocalVisualizer', vis_backends=[dict(type='LocalVisBackend')])
    return show_dir


def configure_tta(cfg) -> None:
    """Swap the model for ``tta_model`` around it and the test pipeline for ``tta_pipeline``.

    Raises :class:`TestOptionError` saying what to add when the config carries neither or only one of them.
    """
    missing = [k for k in ('tta_model', 'tta_pipeline') if not cfg.get(k)]
    if missing:
        hint = TTA_HINT_SEG if is_segmentor_cfg(cfg) else TTA_HINT_DET
        raise TestOptionError(f'--tta needs tta_model and tta_pipeline in the config; {" and ".join(missing)} '
                              f'{"is" if len(missing) == 1 else "are"} missing: {hint}')
    ds = cfg.test_dataloader.dataset
    while 'dataset' in ds and 'pipeline' not in ds:
        ds = ds.dataset
    ds.pipeline = copy.deepcopy(cfg.tta_pipeline)
    tta = copy.deepcopy(cfg.tta_model)
    tta['module'] = cfg.model
    cfg.model = tta


def check_distinct_test_outputs(out: str | None, out_dir: str | None, show_dir: str | None, segmentor: bool) -> None:
    """Refuse ``tools/test.py`` outputs that would overwrite one another: the ``--out`` pickle must not be either
    folder, and a segmentor's ``--format-only`` label maps and ``--show-dir`` drawings (both one ``<image>.png`` per
    image) need different folders.

    Raises:
        TestOptionError: names both options.
    """
    named = {k: osp.abspath(v) for k, v in (('--out', out), ('--out-dir', out_dir), ('--show-dir', show_dir)) if v}
    for folder in ('--out-dir', '--show-dir'):
        if '--out' in named and named.get(folder) == named['--out']:
            raise TestOptionError(f'--out and {folder} are the same path ({out!r}): give the pickle a file name of its '
                                  'own')
    if segmentor and '--out-dir' in named and named['--out-dir'] == named.get('--show-dir'):
        raise TestOptionError(f'--out-dir and --show-dir are the same folder ({out_dir!r}): the drawings would '
                              'overwrite the label maps of the same names; give --show-dir another folder')


def check_dump_path(out_file: str) -> str:
    """Refuse an ``--out`` that is not a pickle file name (before anything is built); returns its absolute path."""
    if not out_file.endswith(('.pkl', '.pickle')):
        raise TestOptionError(f'--out writes a pickle of the raw predictions: give a .pkl file, not {out_file!r} '
                              f'(test-server files: --format-only --out-dir DIR)')
    return osp.abspath(out_file)


def add_dump_metric(runner, out_file: str, segmentor: bool) -> str:
    """Append the raw-prediction dump to the built runner's test evaluator, as mmdet's and mmseg's test tools do:
    mmdet's ``DumpDetResults`` (masks as RLE) for detectors, mmengine's ``DumpResults`` for segmentors. The file
    is a pickle of one dict per image (``pred_instances`` / ``pred_sem_seg`` ...). Returns the absolute path.
    """
    out_file = check_dump_path(out_file)
    os.makedirs(osp.dirname(out_file), exist_ok=True)
    if segmentor:
        from mmengine.evaluator import DumpResults
        runner.test_evaluator.metrics.append(DumpResults(out_file_path=out_file))
    else:
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=out_file))
    return out_file
