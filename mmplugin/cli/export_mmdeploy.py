"""Export a two-stage detector (Mask R-CNN, Cascade Mask R-CNN) end to end (boxes, labels, masks) with mmdeploy
1.3.1 to onnxruntime, then compare onnxruntime with mmdet's ``predict`` at other sizes.

    python tools/export_mmdeploy.py CONFIG [CHECKPOINT] --out work_dirs/x/end2end.onnx
        [--deploy-cfg configs/deploy/maskrcnn_onnxruntime_dynamic.py] [--example 800x1344]
        [--verify 800x1216 480x640 ...] [--image demo.jpg] [--mmdeploy-heads] [--cfg-options ...]

mmdeploy is installed by ``tools/setup_env.sh`` as ``pip install --no-deps mmdeploy==1.3.1``: its own pins
(``protobuf<=3.20.2``, hence ``onnx==1.17``) clash with onnxruntime >= 1.2x, and the export path needs none of its
other dependencies. The torch >= 2.9 fixes and the mmdet-faithful heads come from :mod:`mmplugin.export.mmdeploy`.

The graph's input ``input`` is the image after the model's data preprocessor (normalised, RGB, float32,
``(B, 3, H, W)``); outputs ``dets (B, K, 5)``, ``labels (B, K)``, ``masks (B, K, 28, 28)`` (probabilities of each
detection's class; paste them into the image as mmdeploy's ``End2EndModel`` does; rows with score 0 are padding).
Without CHECKPOINT the weights are random. ``--verify`` compares on random inputs, ``--image`` on a real image
(run through the config's test pipeline). Exits 1 when a comparison fails (boxes beyond 1e-3 relative, scores
beyond 1e-4, labels, mask IoU <= 0.99) or compares nothing (no detection on either side: use an image with objects
or lower ``score_thr``), 3 when mmdeploy is not installed.
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys
import time

from mmplugin.cli.common import require_files, run_tool, tool_main
from mmplugin.config_scope import config_root


def _size(s: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in s.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected HxW such as 800x1344, got {s!r}') from None
    if min(h, w) < 2:
        raise argparse.ArgumentTypeError(f'sizes must be >= 2, got {s!r}')
    return h, w


def parse_args(argv=None):
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint', nargs='?', default=None, help='trained weights (loaded weights-only)')
    p.add_argument('--out', required=True, help='output .onnx file')
    p.add_argument('--deploy-cfg', default=str(config_root() / 'deploy' / 'maskrcnn_onnxruntime_dynamic.py'))
    p.add_argument('--example', type=_size, default=None,
                   help='HxW of the tracing input (default: the static size of the deploy config, else 800x1344)')
    p.add_argument('--verify', type=_size, nargs='*', default=[(480, 640), (97, 131)],
                   help='HxW sizes of random inputs compared with mmdet (none: skip)')
    p.add_argument('--image', default=None, help='also compare on this image (config test pipeline)')
    p.add_argument('--mmdeploy-heads', action='store_true',
                   help="keep mmdeploy's own RPN / R-CNN post-processing (differs from mmdet's, see "
                        'mmplugin.export.mmdeploy)')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    return p.parse_args(argv)


@tool_main
def main(argv=None) -> int:
    args = parse_args(argv)
    require_files(('config', args.config), ('checkpoint', args.checkpoint), ('deploy config', args.deploy_cfg),
                       ('image', args.image))
    try:
        import mmdeploy  # noqa: F401
    except ImportError:
        print('error: mmdeploy is not installed: pip install --no-deps mmdeploy==1.3.1 (see tools/setup_env.sh)',
              file=sys.stderr)
        return 3
    import torch
    from mmengine.config import Config

    from mmplugin.apis import build_model, load_config
    from mmplugin.export import onnx_session
    from mmplugin.export.mmdeploy import end2end_parity, export_end2end

    cfg = load_config(args.config, args.cfg_options)
    if not hasattr(cfg.model, 'roi_head'):
        print(f'error: {osp.basename(args.config)} is not a two-stage detector (no roi_head); use tools/export.py',
              file=sys.stderr)
        return 2
    model = build_model(cfg, args.checkpoint, model_name=args.config, announce_random=True)
    deploy_cfg = Config.fromfile(args.deploy_cfg)
    static = deploy_cfg.onnx_config.get('input_shape')
    h, w = args.example or ((static[1], static[0]) if static else (800, 1344))
    t = time.perf_counter()
    export_end2end(model, deploy_cfg, torch.randn(1, 3, h, w), args.out, mmdet_semantics=not args.mmdeploy_heads)
    print(f'exported {osp.basename(args.config)} to {args.out} in {time.perf_counter() - t:.0f} s (traced at {h}x{w}, '
          f'{"static" if static else "dynamic"} sizes, opset {deploy_cfg.onnx_config.opset_version})')
    images = [(f'random {hh}x{ww}', torch.randn(1, 3, hh, ww)) for hh, ww in (args.verify or [])]
    if static:
        images = [(n, x) for n, x in images if tuple(x.shape[2:]) == (h, w)] or [('random (static size)',
                                                                                    torch.randn(1, 3, h, w))]
    if args.image:
        from mmdeploy.apis import build_task_processor
        proc = build_task_processor(cfg, deploy_cfg, 'cpu')
        _, inputs = proc.create_input(args.image, [w, h] if static else None,
                                      data_preprocessor=model.data_preprocessor)
        images.append((osp.basename(args.image), inputs[0] if isinstance(inputs, list) else inputs))
    if not images:
        return 0
    sess = onnx_session(args.out)
    ok = True
    print('onnxruntime vs mmdet predict (rescale=False):')
    for name, x in images:
        r = end2end_parity(model, sess, x)
        good = (r['num_onnx'] == r['num_torch'] == r['matched'] and r['box_err'] <= 1e-3 and r['score_err'] <= 1e-4
                and (r['mask_iou'] is None or r['mask_iou'] > 0.99))
        verdict = 'ok' if good else 'FAIL'
        if r['num_torch'] == 0:  # 0 == 0 == 0 would pass without comparing anything
            good, verdict = False, 'NOTHING COMPARED (no detections)'
        ok &= good
        iou = '-' if r['mask_iou'] is None else f'{r["mask_iou"]:.4f}'
        print(f'  {name:>20s}  dets onnx {r["num_onnx"]} / torch {r["num_torch"]}, matched {r["matched"]}, '
              f'box err {r["box_err"]:.1e}, score err {r["score_err"]:.1e}, min mask IoU {iou}  {verdict}')
    return 0 if ok else 1


if __name__ == '__main__':
    run_tool(main)
