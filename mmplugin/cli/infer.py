"""Run a trained detector or segmentor on an image or a folder of images; draw and / or save its predictions.

    python tools/infer.py CONFIG CHECKPOINT IMAGE_OR_FOLDER [--out result.png | DIR] [--pred-out preds.json]
        [--no-draw] [--score-thr 0.3] [--device cpu] [--cfg-options ...] [--allow-partial]
        [--compile [dynamic|static]] [--compile-sizes N] [--fast [auto|bf16|fp16]]
        [--runtime pytorch|openvino|onnxruntime]

CHECKPOINT is a path or an http(s) URL. It must fit the model of CONFIG (see tools/test.py), unless --allow-partial.
Published whole-model checkpoints (official Swin detection / segmentation repositories, mmdet / mmseg model
zoos) load as they are: their backbone part is converted on the fly (docs/published_checkpoints.md).

--out: the drawing (mmdet's DetLocalVisualizer or mmseg's SegLocalVisualizer, chosen by the config's default_scope):
an image file for one image (default result.png), a folder for a folder of images (default infer_vis/).
--pred-out FILE.json: machine-readable predictions, mmdet DetInferencer's per-image dicts (bboxes, labels, scores,
RLE masks); for segmentors the label map PNG beside it (FILE_labels.png, or FILE/<image>.png for a folder). See
docs/evaluation.md. No output overwrites another: a drawing path equal to the json or a label map is refused.
``--runtime openvino`` (or ``onnxruntime``) runs backbone + neck in that runtime, heads in PyTorch
(:mod:`mmplugin.inference.runtime`; OpenVINO compiles one model per input shape, cached; speed: docs/benchmarks.md).
``--compile static`` compiles backbone + neck per input size with frozen weights (:mod:`mmplugin.inference.compiled`;
for SwiftFormer the fastest PyTorch path on a CPU at fixed sizes; Swin runs faster eager, with its attention kernel).
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

from mmplugin.cli.common import require_files, run_tool, tool_main
from mmplugin.cli.inference_options import add_inference_options


def _load_checked(model, ckpt, args) -> bool:
    """Strict loading: refuse a checkpoint that does not fit the config's model unless --allow-partial.

    The file read once by :func:`~mmplugin.checkpoint.load_checkpoint_file` is checked and loaded into the model
    mmdet's / mmseg's init function built without weights (:func:`mmplugin.apis.load_checkpoint_checked`: published
    layouts converted), so a file that does not fit never ends as a bare ``KeyError`` or as random weights behind a
    warning.
    """
    from mmplugin.apis import load_checkpoint_checked
    problem = load_checkpoint_checked(model, ckpt, strict=False, source=args.checkpoint, model_name=args.config)
    if problem and not args.allow_partial:
        print(f'error: {problem}\nPass --allow-partial to run anyway.', file=sys.stderr)
        return False
    if problem:
        print(f'warning (--allow-partial): {problem}', file=sys.stderr)
    return True


def _parse(argv):
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('image', help='an image file or a folder of images')
    p.add_argument('--out', help='drawing: an image file (one image; default result.png) or a folder (a folder of '
                                 'images; default infer_vis/)')
    p.add_argument('--no-draw', action='store_true', help='draw nothing (with --pred-out)')
    p.add_argument('--pred-out', help='write the predictions as json (DetInferencer format; segmentors: label map '
                                      'PNGs beside it)')
    p.add_argument('--score-thr', type=float, default=0.3, help='drawing threshold (the json keeps all)')
    p.add_argument('--device', default='cpu')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                   help='override config entries, key=value (as tools/train.py and tools/test.py)')
    p.add_argument('--allow-partial', action='store_true',
                   help='run even if the checkpoint does not fit the model (missing keys stay random)')
    add_inference_options(p)
    args = p.parse_args(argv)
    if args.no_draw and args.out:
        p.error('--no-draw and --out contradict each other')
    if args.no_draw and not args.pred_out:
        p.error('--no-draw without --pred-out would write nothing')
    return args


@tool_main
def main(argv=None) -> int:
    args = _parse(argv)
    import mmplugin  # noqa: F401
    from mmplugin.checkpoint import CheckpointError, load_checkpoint_file
    from mmplugin.cli.predictions import InferenceWriter, PredictionOutputError, list_images
    require_files(('config', args.config), ('checkpoint', args.checkpoint), urls=True)
    try:
        images = list_images(args.image)
    except PredictionOutputError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    many = osp.isdir(args.image)
    out = None if args.no_draw else (args.out or ('infer_vis' if many else 'result.png'))
    if out is not None and not many:
        from mmplugin.cli.predictions import check_drawing_path
        try:
            check_drawing_path(out)  # before the model is built
        except PredictionOutputError as err:
            print(f'error: {err}', file=sys.stderr)
            return 2
    try:
        ckpt = load_checkpoint_file(args.checkpoint)  # fail fast, with a clear message, on a bad file
    except CheckpointError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    from mmplugin.apis import load_config
    cfg = load_config(args.config, args.cfg_options)
    from mmplugin.apis import check_model_wiring
    check_model_wiring(cfg, args.config)  # a neck that does not fit the backbone: the config's mistake, before any data
    from mmplugin.cli.predictions import check_distinct_outputs
    check_distinct_outputs(out, args.pred_out, many, cfg.get('default_scope') == 'mmseg')  # before the model
    cfg.model.get('backbone', {}).pop('init_cfg', None)
    segmentor = cfg.get('default_scope') == 'mmseg'
    if segmentor:
        from mmseg.apis import inference_model as infer
        from mmseg.apis import init_model as init
        from mmseg.registry import DATASETS
    else:
        from mmdet.apis import inference_detector as infer
        from mmdet.apis import init_detector as init
        from mmdet.registry import DATASETS
    import warnings
    with warnings.catch_warnings():  # mmdet warns that it names COCO's classes without a checkpoint: set below
        warnings.filterwarnings('ignore', message='checkpoint is None')
        model = init(cfg, None, device=args.device)  # no weights yet: the file read above, checked, is loaded next
    if not _load_checked(model, ckpt, args):
        return 2
    # the classes: the checkpoint's (mmengine keeps them in meta), else the config's dataset (never COCO's 80 names
    # behind a warning, which mmdet falls back to)
    meta = (ckpt.get('meta') or {}).get('dataset_meta') if isinstance(ckpt, dict) else None
    model.dataset_meta = meta or DATASETS.build(dict(cfg.test_dataloader.dataset, lazy_init=True)).metainfo
    del ckpt
    from mmplugin.cli.inference_options import apply_inference_options
    feats = apply_inference_options(model, args, args.device)
    try:
        writer = InferenceWriter(model, segmentor, out, args.pred_out, many, args.score_thr)
    except PredictionOutputError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    for image in images:
        result = infer(model, image)
        record = writer.add(image, result)
        if not segmentor:
            kept = sum(s >= args.score_thr for s in record['scores'])
            print(f'{image}: {kept} instances above score {args.score_thr}')
    if feats is not None:
        print(feats.message())
        feats.close()
    if out is not None:
        print(f'visualisation written to {os.path.abspath(out)}')
    if writer.close():
        print(f'predictions written to {os.path.abspath(args.pred_out)}')
    return 0


if __name__ == '__main__':
    run_tool(main)
