"""Rows of ``tools/speed_table.py``: a backbone's speed against the CPU's own matmul peak, its peers and the
deployment runtimes, and a whole model's inference time with the share spent in ``extract_feat``.

Every figure of one backbone comes from the same interleaved rounds (:func:`mmplugin.utils.timing.interleaved`),
the 4096x4096 matmul that gives the peak included, so machine noise hits all of them alike.
"""
from __future__ import annotations

import os.path as osp
import time

import torch

from mmplugin.utils.timing import interleaved, matmul_peak_call

__all__ = ['cpu_description', 'backbone_rows', 'whole_model_rows']


def cpu_description() -> str:
    """The CPU model with family / model numbers and its vector extensions, e.g. ``'... (family 6, model 167;
    avx2, avx512f, avx512_bf16, amx_bf16)'``."""
    from mmplugin.utils.cpu import cpu_flags, cpu_model
    flags = cpu_flags()
    isa = ', '.join(f for f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16') if f in flags) or 'no AVX2'
    name = cpu_model()
    return f'{name[:-1]}; {isa})' if name.endswith(')') else f'{name} ({isa})'


def backbone_rows(family: str, arch: str, size, rounds: int, runtimes, bf16: bool, workdir: str) -> list[dict]:
    """Timed rows of backbone ``family``/``arch`` at ``size`` (batch 1, eval, random weights).

    Args:
        runtimes: any of ``'eager'``, ``'onnxruntime'``, ``'openvino'`` (ONNX export into ``workdir``).
        bf16: also time eager bf16 autocast rows.

    Returns:
        One dict per (implementation, runtime, precision): ``seconds`` (median), ``gflops`` (2 x the MACs of
        :func:`mmplugin.analysis.complexity.backbone_complexity` per second; None for another network),
        ``ratio`` (speed over the first row), ``rel_err`` (max relative error against the plugin's eager fp32
        outputs; None for another network), ``model_gflop``, ``peak_gflops`` (the matmul's in that precision).
    """
    from mmplugin import export
    from mmplugin.analysis.complexity import backbone_complexity
    from mmplugin.analysis.peers import build_peers
    from mmplugin.models.backbones.base import get_family
    from mmplugin.utils.numerics import max_rel_error
    torch.manual_seed(0)
    ours = get_family(family)(arch).eval()
    peers = build_peers(family, arch, ours)
    for m in peers.values():
        m.eval()  # mmdet's Swin.train() returns None: no chaining
    x = torch.randn(1, 3, *size)
    flops = 2e9 * backbone_complexity(family, arch, size)[1]
    flatten_outputs = export.flatten_outputs
    with torch.no_grad():
        ref = flatten_outputs(ours(x))
    fns, outs = {}, {}

    def eager(m, dtype=None):
        def fn():
            with torch.no_grad(), torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                outs[fn] = flatten_outputs(m(x))
        return fn

    for name, m in peers.items():
        fns[(name, 'eager', 'fp32')] = eager(m)
    fns[('mmplugin', 'eager', 'fp32')] = eager(ours)
    if bf16:
        for name, m in peers.items():
            fns[(name, 'eager', 'bf16 autocast')] = eager(m, torch.bfloat16)
        fns[('mmplugin', 'eager', 'bf16 autocast')] = eager(ours, torch.bfloat16)
    onnx_path = osp.join(workdir, f'{family}_{arch}.onnx')
    if {'onnxruntime', 'openvino'} & set(runtimes):
        t = time.perf_counter()
        export.export_onnx(export.ExportPart(ours, 'backbone'), onnx_path, export.example_input(2, (224, 256)))
        print(f'  exported {family} {arch} to ONNX in {time.perf_counter() - t:.0f} s', flush=True)
    if 'onnxruntime' in runtimes:
        sess = export.onnx_session(onnx_path)

        def ort_fn():
            outs[ort_fn] = tuple(torch.from_numpy(o) for o in sess.run(None, {'input': x.numpy()}))
        fns[('mmplugin', 'onnxruntime', 'fp32')] = ort_fn
    if 'openvino' in runtimes:
        try:
            import openvino as ov
        except ImportError:
            print('  openvino not installed: no OpenVINO row (pip install openvino)')
        else:
            compiled = ov.Core().compile_model(onnx_path, 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})

            def ov_fn():
                res = compiled({0: x.numpy()})
                outs[ov_fn] = tuple(torch.from_numpy(res[o]) for o in compiled.outputs)
            fns[('mmplugin', 'openvino', 'fp32')] = ov_fn
    # the matmul peak is timed in the same interleaved rounds, so machine noise hits it like the models
    peak_calls = {p: matmul_peak_call(d)
                  for p, d in (('fp32', torch.float32), ('bf16 autocast', torch.bfloat16)) if p == 'fp32' or bf16}
    for p, (fn, _) in peak_calls.items():
        fns[('matmul', p)] = fn
    times = interleaved(fns, rounds)
    peaks = {p: gflop / times.pop(('matmul', p)) for p, (_, gflop) in peak_calls.items()}
    baseline = times[next(iter(times))]
    rows = []
    for key, sec in times.items():
        name, runtime, precision = key
        try:  # peers computing the same function with the same weights get an error too
            err = max_rel_error(outs[fns[key]], ref)
        except ValueError:  # another network (e.g. a ResNet peer): other shapes
            err = None
        same = err is not None  # another network (other outputs) has other FLOPs: no GFLOP/s for it
        rows.append(dict(backbone=f'{family} {arch}', impl=name, runtime=runtime, precision=precision, seconds=sec,
                         gflops=flops / sec / 1e9 if same else None, ratio=baseline / sec, rel_err=err,
                         model_gflop=flops / 1e9, peak_gflops=peaks.get(precision)))
    return rows


def whole_model_rows(config: str, size, rounds: int) -> list[dict]:
    """Whole-model eval time and the share spent in ``extract_feat`` (random weights, thresholds at 0)."""
    from mmplugin.apis import build_model, load_config
    cfg = load_config(config)
    scope = cfg.get('default_scope', 'mmdet')
    if cfg.model.get('test_cfg', {}).get('rcnn') is not None:
        cfg.model.test_cfg.rcnn.score_thr = 0.0  # the heads see the full number of boxes a trained model would
    torch.manual_seed(0)
    model = build_model(cfg)
    h, w = size
    x = torch.randn(1, 3, h, w)
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=meta)
    else:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=meta)
    with torch.no_grad():
        times = interleaved({'whole': lambda: model.predict(x, [sample]),
                             'extract_feat': lambda: model.extract_feat(x)}, rounds)
    return [dict(config=osp.basename(config), size=list(size), whole_seconds=times['whole'],
                 extract_feat_seconds=times['extract_feat'], extract_feat_share=times['extract_feat'] / times['whole'])]


