"""One prepared GPU check (a few minutes): every backbone in fp16 and bf16 (autocast and half models) against fp32,
a bit-identical deterministic backward, SDPA backend of the Swin window attention, Mask R-CNN training steps with
fp16 AMP and bf16 for the plugin's Swin-T and SwiftFormer-L1 and for mmdet's own Swin-T config, and an AMP step of
the Swin V2-T Cascade config, with throughput and peak memory side by side.

    python tools/gpu_check.py [--steps 6] [--size 800x1216] [--batch 2] [--json FILE]
    python tools/gpu_check.py --cpu-smoke      # the same code path on CPU at a tiny size (CI, no GPU)

Without a CUDA device (and without --cpu-smoke) it prints that and exits 0: CI never needs a GPU.

What it reports:

* ``precision``: per family (smoke arch), :func:`mmplugin.testing.conformance.check_reduced_precision` on the
  device (fp16 and bf16, autocast and ``.to(dtype)`` models, padded / shifted sizes, inputs up to 1e3, within the
  bounds the CPU suite asserts), and the full Swin V2-T at 224x224 and 100x140; ``ok`` or the failed assertion.
* ``deterministic``: a Swin V2 forward + backward run twice under ``torch.use_deterministic_algorithms(True)``:
  whether every gradient is bit-identical.
* ``sdpa``: which SDPA kernels accept the Swin call (float mask ``(B*nW, heads, 49, 49)``, head dim 32): flash
  attention takes no float mask, the memory-efficient kernel does; and the kernel the default dispatch ran
  (from the profiler).
* ``train``: per model and precision, finite losses (fp16 with a GradScaler), median step time, images/s and peak
  ``torch.cuda.max_memory_allocated`` for ``--steps`` forward + backward + AdamW steps on random COCO-like data.
* ``backbones``: the speed table's rows on the device (:mod:`mmplugin.analysis.device_rows`) for each
  ``--backbones`` entry: eval forwards at ``--infer-size`` in fp32 (TF32 off), bf16 / fp16 autocast and an fp16
  model, against the peers with the same weights and the plugin's GEMMs alone; ``--compile`` precisions add a
  ``torch.compile`` row; training steps at ``--train-size`` (batch 2) with their peak memory, with and without
  activation checkpointing; the attention operators the Swin forwards and backwards ran.

Where mmcv was installed without its compiled ops (a lent GPU machine with torch and torchvision but no network or
build time), NMS and RoIAlign run on torchvision's kernels
(:func:`mmplugin.engine.mmcv_ops.install_torchvision_kernels`) for every detector alike, and the report says so
(``mmcv_kernels``). ``--json`` is rewritten after every section, so a run stopped early keeps what it measured.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import os.path as osp
import statistics
import time

from mmplugin.cli.common import run_tool, tool_main
from mmplugin.config_scope import config_root

ROOT = str(config_root().parent)  # holds configs/

SECTIONS = ('checks', 'backbones', 'detectors')

MODELS = {  # name -> (config, backbone override or None)
    'mmplugin-swin-t': ('configs/swin/swin_t_maskrcnn_1x_coco.py', None),
    'mmdet-swin-t': ('configs/swin/swin_t_maskrcnn_1x_coco.py',
                     dict(_delete_=True, type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                          num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4, qkv_bias=True, drop_path_rate=0.1,
                          patch_norm=True, out_indices=(0, 1, 2, 3), with_cp=False, convert_weights=False)),
    'mmplugin-swiftformer-l1': ('configs/swiftformer/swiftformer_l1_maskrcnn_1x_coco.py', None),
    'mmplugin-swinv2-t-cascade': ('configs/swinv2/swinv2_t_cascade_maskrcnn_3x_coco.py', None),
}


def _outcome(fn, *args, **kwargs) -> str:
    """'ok', or the first line of the assertion / error that ``fn`` raised."""
    try:
        fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001  (every check is reported, none stops the others)
        return f'FAILED {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ""}'
    return 'ok'


def _full_v2_tiny(device, sizes) -> None:
    import torch

    from mmplugin.models import SwinTransformerV2
    from mmplugin.testing.numeric import REDUCED_VS_FP32
    from mmplugin.utils.numerics import rel_error
    model = SwinTransformerV2('tiny', drop_path_rate=0.0).to(device).eval()
    for size in sizes:
        x = torch.randn(1, 3, *size, device=device)
        for name, dtype in (('fp16', torch.float16), ('bf16', torch.bfloat16)):
            with torch.no_grad():
                ref = model(x)
                with torch.autocast(device.type, dtype=dtype):
                    auto = model(x)
                half = model.to(dtype)(x.to(dtype))
                model.float()
            for mode, outs in (('autocast', auto), ('model', half)):
                for i, (o, r) in enumerate(zip(outs, ref)):
                    err = rel_error(o, r)
                    assert err < REDUCED_VS_FP32[name], f'{size} {name} {mode} level {i}: rel. error {err:.3g}'


def precision_report(device, quick: bool = False) -> dict:
    from mmplugin.models.backbones.base import FAMILIES
    from mmplugin.testing.conformance import check_reduced_precision
    out = {}
    for name, cls in FAMILIES.items():
        out[name] = _outcome(check_reduced_precision, cls, cls.smallest_arch(), device=str(device),
                             sizes=[(37, 53)] if quick else [(64, 64), (37, 53)],
                             scales=(1e3, ) if quick else (1.0, 1e3))
    out['swinv2-tiny-full'] = ('skipped (--cpu-smoke)' if quick else
                               _outcome(_full_v2_tiny, device, [(224, 224), (100, 140)]))
    return out


def deterministic_backward(device) -> str:
    """Two forward + backward passes of a small Swin V2 under deterministic algorithms: bit-identical gradients?"""
    import torch

    from mmplugin.models import SwinTransformerV2
    from mmplugin.testing.numeric import randomize_
    model = randomize_(SwinTransformerV2(dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]),
                                         drop_path_rate=0.0), seed=1).to(device).train()
    x = torch.randn(2, 3, 100, 140, device=device)
    grads = []
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            sum(o.pow(2).mean() for o in model(x)).backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    except RuntimeError as err:
        return f'FAILED: {str(err).splitlines()[0][:200]}'
    finally:
        torch.use_deterministic_algorithms(previous)
    same = all(torch.equal(a, b) for a, b in zip(*grads))
    return 'bit-identical' if same else 'FAILED: gradients differ between two runs'


def sdpa_report(device) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = torch.float16 if device.type == 'cuda' else torch.float32
    q, k, v = (torch.randn(2 * 64, 3, 49, 32, device=device, dtype=dtype) for _ in range(3))
    mask = torch.randn(2 * 64, 3, 49, 49, device=device, dtype=dtype)
    out = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out[backend.name] = 'accepts the float mask'
        except RuntimeError as err:
            out[backend.name] = f'refused: {str(err).splitlines()[0][:120]}'
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=acts) as prof:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ran = sorted({e.key for e in prof.key_averages() if 'attention' in e.key.lower() and e.key.startswith('aten::_')})
    out['default_dispatch'] = ran or ['(not visible in the profile)']
    return out


def build_detector(name: str, device):
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg_path, backbone = MODELS[name]
    cfg = Config.fromfile(osp.join(ROOT, cfg_path))
    if backbone is not None:  # a copy: merging consumes its '_delete_' (a second build would keep 'arch')
        cfg.merge_from_dict(dict(model=dict(backbone=copy.deepcopy(backbone))))
    cfg.model.backbone.pop('init_cfg', None)
    init_default_scope('mmdet')
    return DET_MODELS.build(cfg.model).to(device)


def train_steps(name: str, dtype_name: str, size, batch: int, steps: int, device) -> dict:
    import torch
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(0)
    model = build_detector(name, device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    dtype = {'fp16': torch.float16, 'bf16': torch.bfloat16, 'fp32': None}[dtype_name]
    scaler = torch.amp.GradScaler(device.type, enabled=dtype_name == 'fp16')
    packed = demo_mm_inputs(batch_size=batch, image_shapes=[(3, *size)] * batch, num_items=[5] * batch,
                            num_classes=80, with_mask=True, device=str(device))
    data = model.data_preprocessor(packed, True)
    if device.type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(steps):
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss_dict = model.loss(data['inputs'], data['data_samples'])
        # the terms named loss, as mmdet's parse_losses sums them (the dict also holds metrics such as 'acc')
        loss = sum(v.sum() if isinstance(v, torch.Tensor) else sum(x.sum() for x in v)
                   for k, v in loss_dict.items() if 'loss' in k)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if device.type == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
    step = statistics.median(times[1:] if len(times) > 1 else times)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == 'cuda' else float('nan')
    return dict(finite=all(math.isfinite(v) for v in losses), losses=[round(v, 4) for v in losses],
                step_s=round(step, 4), images_per_s=round(batch / step, 2), peak_mib=round(peak, 1))


@tool_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--steps', type=int, default=6)
    p.add_argument('--size', default='800x1216', help='HxW of the training images')
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--json', default=None, help='write the report here as JSON')
    p.add_argument('--cpu-smoke', action='store_true',
                   help='run every section on the CPU at 64x96 (CI): smallest archs, one round, fp32 training')
    p.add_argument('--precisions', nargs='+', default=None, choices=['fp16', 'bf16', 'fp32'],
                   help='default: the reduced precisions the GPU runs natively (fp16; bf16 from sm80)')
    p.add_argument('--backbones', nargs='*', default=['swin:tiny', 'swinv2:tiny', 'swiftformer:l1'],
                   help='FAMILY:ARCH rows of the speed table to run on the device (none: skip them)')
    p.add_argument('--infer-size', default='800x1216', help='HxW of the backbone inference rows (batch 1)')
    p.add_argument('--train-size', default='512x768', help='HxW of the backbone training rows (batch 2)')
    p.add_argument('--rounds', type=int, default=10, help='interleaved rounds of the backbone rows')
    p.add_argument('--compile', nargs='*', default=[], metavar='PRECISION',
                   help="precisions of the backbone rows that also get a torch.compile row, e.g. 'bf16 autocast'")
    p.add_argument('--compile-mode', default='reduce-overhead',
                   help="torch.compile mode of the --compile rows (default: 'reduce-overhead', CUDA graphs)")
    p.add_argument('--sections', nargs='+', default=list(SECTIONS), choices=SECTIONS,
                   help='what to run: the precision / determinism / SDPA checks, the backbone rows, the detector '
                        'training steps (default: all)')
    args = p.parse_args(argv)
    from mmplugin.analysis.device_rows import PRECISIONS
    from mmplugin.analysis.timing import parse_hw
    from mmplugin.models.backbones.base import FAMILIES
    bad = [c for c in args.compile if c not in PRECISIONS]
    if bad:
        p.error(f'--compile takes precisions among {", ".join(map(repr, PRECISIONS))}, got {bad}')
    bad = [b for b in args.backbones if b.partition(':')[0] not in FAMILIES or not b.partition(':')[2]]
    if bad:
        p.error(f'--backbones takes FAMILY:ARCH with FAMILY one of {", ".join(FAMILIES)}, got {bad}')
    for b in args.backbones:
        family, _, arch = b.partition(':')
        try:
            FAMILIES[family].resolve_arch(arch)
        except (ValueError, TypeError) as err:
            p.error(f'--backbones {b}: {err}')
    if args.rounds < 1 or args.steps < 1:
        p.error(f'--rounds and --steps must be >= 1, got {args.rounds} and {args.steps}')
    for opt in ('infer_size', 'train_size', 'size'):
        try:
            parse_hw(getattr(args, opt))
        except ValueError as err:
            p.error(f"--{opt.replace('_', '-')}: {err}")
    # deterministic cuBLAS GEMMs need this before the first CUDA GEMM of the process (the checks below run many)
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    import torch

    import mmplugin  # noqa: F401
    if args.cpu_smoke:
        # the detector pair runs the Swin-T Mask R-CNN step on the CPU; the per-model list is for the GPU
        device, size, steps, precisions, names = torch.device('cpu'), (64, 96), 1, ['fp32'], []
    elif not torch.cuda.is_available():
        print('gpu_check: no CUDA device visible; nothing to check (this is not an error).')
        return 0
    else:
        device, steps, names = torch.device('cuda'), args.steps, list(MODELS)
        from mmplugin.inference.fast import native_dtypes  # one place decides what the hardware runs natively
        native = native_dtypes(device)
        precisions = args.precisions or [n for n, d in (('fp16', torch.float16), ('bf16', torch.bfloat16))
                                         if d in native]
        size = parse_hw(args.size)
        print(f'gpu_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, '
              f'batch {args.batch} x {size[0]}x{size[1]}, {steps} steps')
    from mmplugin.engine.mmcv_ops import install_torchvision_kernels
    kernels = 'torchvision (mmcv without compiled ops)' if install_torchvision_kernels() else 'mmcv'

    def save():
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(report, f, indent=2)

    report = {'device': str(device), 'torch': torch.__version__, 'mmcv_kernels': kernels,
              'precision': {}, 'deterministic': 'not run', 'sdpa': {}, 'train': {}, 'backbones': {}}
    print(f'mmcv kernels (NMS, RoIAlign): {kernels}')
    ok = True
    if 'checks' in args.sections:
        report.update(precision=precision_report(device, quick=args.cpu_smoke),
                      deterministic=deterministic_backward(device), sdpa=sdpa_report(device))
        save()
        print('fp16 / bf16 against fp32 (autocast and half models):')
        for k, v in report['precision'].items():
            print(f'  {k:20s} {v}')
        print(f"deterministic backward: {report['deterministic']}")
        ok = all(not v.startswith('FAILED') for v in report['precision'].values())
        ok &= not report['deterministic'].startswith('FAILED')
        print('SDPA with the Swin float mask:')
        for k, v in report['sdpa'].items():
            print(f'  {k:20s} {v}')
    if args.backbones and 'backbones' in args.sections:
        from mmplugin.analysis.device_report import backbone_report
        rows = backbone_report(args.backbones, device, save, report['backbones'], args.infer_size,
                               args.train_size, args.rounds, args.compile, args.compile_mode)
        report['backbones'] = rows
    if 'detectors' in args.sections:
        from mmplugin.analysis.device_report import detector_pair_report
        pair_precisions = ['fp32'] + [f'{p} autocast' for p in ('bf16', 'fp16') if p in precisions]
        report['detector_pair'] = pair = detector_pair_report(osp.join(ROOT, MODELS['mmplugin-swin-t'][0]), device,
                                                              size, steps, args.batch, pair_precisions)
        ok &= all(math.isfinite(v) for r in pair if r['losses'] for v in r['losses'].values())
        save()
    for name in (names if 'detectors' in args.sections else []):
        for prec in precisions:
            try:
                r = train_steps(name, prec, size, args.batch, steps, device)
            except Exception as err:  # noqa: BLE001  (report every model even if one fails)
                import traceback
                frames = traceback.extract_tb(err.__traceback__)[-3:][::-1]
                where = ' <- '.join(f'{osp.basename(f.filename)}:{f.lineno}' for f in frames)
                r = dict(finite=False, error=f'{type(err).__name__}: {str(err)[:300]} at {where}')
            report['train'][f'{name}/{prec}'] = r
            ok &= r['finite']
            print(f'  {name:26s} {prec}: ' + ', '.join(f'{k}={v}' for k, v in r.items() if k != 'losses'))
            save()
            if device.type == 'cuda':
                torch.cuda.empty_cache()
    save()
    return 0 if ok else 1


if __name__ == '__main__':
    run_tool(main)
