"""Rows of ``tools/speed_table.py``: a backbone's speed against the CPU's own matmul peak, its peers and the
deployment runtimes, and a whole model's inference time with the share spent in ``extract_feat``.

Every figure of one backbone comes from the same interleaved rounds (:func:`mmplugin.utils.timing.interleaved`),
the 4096x4096 matmul that gives the peak included, so machine noise hits all of them alike.
"""
from __future__ import annotations

import copy
import os.path as osp
import time

import torch

from mmplugin.utils.timing import interleaved, matmul_peak_call

__all__ = ['cpu_description', 'backbone_rows', 'training_rows', 'whole_model_rows']

PREPACKED_ROW = 'mmplugin prepacked'  # the linear weights frozen and packed, as --fast runs them


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
        runtimes: any of ``'eager'`` (the plugin's model as it is, and as ``--fast`` runs it: row
            ``mmplugin prepacked``, :mod:`mmplugin.models.layers.prepack`),
            ``'compiled'`` (``torch.compile``, inductor, frozen weights, the input's static
            shape), ``'onnxruntime'``, ``'openvino'`` (ONNX export into ``workdir``; bf16 too where native).
        bf16: also time bf16 rows (eager autocast, compiled autocast, OpenVINO bf16 inference precision).

    Returns:
        One dict per (implementation, runtime, precision): ``seconds`` (median), ``gflops`` (2 x the MACs of
        :func:`mmplugin.analysis.complexity.backbone_complexity` per second; None for another network),
        ``ratio`` (speed over the first row), ``rel_err`` (max relative error against the plugin's eager fp32
        outputs; None for another network), ``model_gflop``, ``peak_gflops`` (the 4096 product's in that
        precision, on the faster of MKL and oneDNN), ``gemm_ratio`` (seconds over the GEMM-only time in that precision,
        for the plugin's rows). The first row of each precision named ``GEMMs alone`` is that GEMM-only time: every
        linear and 1x1 convolution of the plugin's forward timed alone at its shape on its faster kernel
        (:mod:`mmplugin.analysis.gemm_floor`), in the same rounds.
    """
    from mmplugin import export
    from mmplugin.analysis.complexity import backbone_complexity
    from mmplugin.analysis.peers import build_peers
    from mmplugin.models.backbones.base import get_family
    from mmplugin.models.layers.prepack import frozen_count, prepack_weights
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

    # the form --fast runs: a copy whose linear weights stay packed in oneDNN's layout (the packs follow a parameter),
    # of the plugin and of its own other forms not packed yet (the deployed SwiftFormer packs its own constants)
    packed = prepack_weights(copy.deepcopy(ours))
    peers.update({f'{name} prepacked': prepack_weights(copy.deepcopy(m)) for name, m in list(peers.items())
                  if name.startswith('mmplugin') and not frozen_count(m)})
    for name, m in peers.items():
        fns[(name, 'eager', 'fp32')] = eager(m)
    fns[('mmplugin', 'eager', 'fp32')] = eager(ours)
    fns[(PREPACKED_ROW, 'eager', 'fp32')] = eager(packed)
    if bf16:
        for name, m in peers.items():
            fns[(name, 'eager', 'bf16 autocast')] = eager(m, torch.bfloat16)
        fns[('mmplugin', 'eager', 'bf16 autocast')] = eager(ours, torch.bfloat16)
        fns[(PREPACKED_ROW, 'eager', 'bf16 autocast')] = eager(packed, torch.bfloat16)
    if 'compiled' in runtimes:
        compiled = _compiled_for(ours, x)
        fns[('mmplugin', 'compiled', 'fp32')] = eager(compiled)
        if bf16:
            fns[('mmplugin', 'compiled', 'bf16 autocast')] = eager(_compiled_for(ours, x, torch.bfloat16),
                                                                 torch.bfloat16)
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
            for precision, hint in (('fp32', 'f32'), ('bf16', 'bf16'))[:2 if bf16 else 1]:
                fns[('mmplugin', 'openvino', precision)] = _openvino_call(ov, onnx_path, x, hint, outs)
    # the matmul peak and the GEMM-only time are timed in the same interleaved rounds, so machine noise hits them
    # like the models
    from mmplugin.analysis.gemm_floor import KERNELS, gemm_calls, gemm_seconds, linear_shapes
    precisions = {'fp32': torch.float32, **({'bf16 autocast': torch.bfloat16} if bf16 else {})}
    shapes = linear_shapes(ours, x)
    peak_gflop = {}
    for p, d in precisions.items():
        for kern in KERNELS:
            fns[('matmul', p, kern)], peak_gflop[p] = matmul_peak_call(d, kern)
        fns.update({(p, *key): fn for key, fn in gemm_calls(shapes, d).items()})
    times = interleaved(fns, rounds)
    peaks = {p: peak_gflop[p] / min(times.pop(('matmul', p, k)) for k in KERNELS) for p in precisions}
    gemm = {}
    for p in precisions:
        mine = {key[1:]: times.pop(key) for key in list(times) if key[0] == p and key[1] == 'gemm'}
        gemm[p] = gemm_seconds(mine, shapes)[0]
    baseline = times[next(iter(times))]
    rows = []
    for p, sec in gemm.items():
        rows.append(dict(backbone=f'{family} {arch}', impl='GEMMs alone', runtime='fastest kernel per shape',
                         precision=p, seconds=sec, gflops=None, ratio=baseline / sec, rel_err=None,
                         model_gflop=flops / 1e9, peak_gflops=peaks[p], gemm_ratio=1.0))
    for key, sec in times.items():
        name, runtime, precision = key
        try:  # peers computing the same function with the same weights get an error too
            err = max_rel_error(outs[fns[key]], ref)
        except ValueError:  # another network (e.g. a ResNet peer): other shapes
            err = None
        same = err is not None  # another network (other outputs) has other FLOPs: no GFLOP/s for it
        kind = 'bf16 autocast' if precision.startswith('bf16') else 'fp32'
        rows.append(dict(backbone=f'{family} {arch}', impl=name, runtime=runtime, precision=precision, seconds=sec,
                         gflops=flops / sec / 1e9 if same else None, ratio=baseline / sec, rel_err=err,
                         model_gflop=flops / 1e9, peak_gflops=peaks.get(kind),
                         gemm_ratio=sec / gemm[kind] if name.startswith('mmplugin') and kind in gemm else None))
    return rows


def _compiled_for(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None = None):
    """``model`` compiled by inductor for ``x``'s static shape with frozen weights (constant-folded, oneDNN
    weight prepacking), warmed up once; a copy, so the eager model is untouched."""
    import copy

    from mmplugin.inference.compiled import freezing
    m = torch.compile(copy.deepcopy(model), backend='inductor', dynamic=False)
    t = time.perf_counter()
    with torch.no_grad(), torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None), freezing():
        m(x)
    print(f'  compiled ({dtype or torch.float32}) in {time.perf_counter() - t:.0f} s', flush=True)
    return m


def _openvino_call(ov, onnx_path: str, x: torch.Tensor, hint: str, outs: dict):
    """A zero-argument OpenVINO inference of ``x`` compiled for its static shape in precision ``hint``; stores
    its outputs in ``outs[fn]``."""
    from mmplugin.inference.runtime import compile_openvino
    core = ov.Core()
    compiled = compile_openvino(core, core.read_model(onnx_path), tuple(x.shape), hint)
    arr = x.numpy()

    def fn():
        res = compiled({0: arr})
        outs[fn] = tuple(torch.from_numpy(res[o].copy()) for o in compiled.outputs)
    return fn


BLAS_ROW = 'mmplugin, linears on BLAS'
ONEDNN_ROW = 'mmplugin, linears on oneDNN'
COMPILED_ROW = 'mmplugin compiled'


def training_rows(family: str, arch: str, size=(512, 768), rounds: int = 3, bf16: bool = False,
                  memory: bool = True, compiled: bool = False) -> list[dict]:
    """Backbone training steps (batch 2, forward + backward + AdamW step, train mode) of the plugin and its peers
    with the same weights (:func:`mmplugin.analysis.peers.benchmark_models`; networks that are not the same
    function are left out), interleaved, each precision in rounds of its own; and each one's peak memory of a step
    in a fresh process (:func:`mmplugin.analysis.memory.peak_memory`, plugin and first peer, with and without
    activation checkpointing).

    Where oneDNN is available, the same fp32 step with the plugin's training linears on the other kernel
    (:mod:`mmplugin.models.layers.gemm`: where oneDNN serves them by default, all on torch's BLAS; on Intel CPUs,
    where BLAS does but for thin linears' forward products, all on oneDNN) runs in the same rounds too (row
    :data:`BLAS_ROW` or :data:`ONEDNN_ROW`): what the kernel choice is worth on this CPU.

    With ``compiled``, the plugin's step with the model under ``torch.compile`` (inductor, forward and backward
    graphs; a copy of the model with its own optimizer, compiled by one untimed step per precision before the
    rounds) runs in the same rounds too (row :data:`COMPILED_ROW`): whether compiling pays off for training on this
    CPU.

    In the same rounds, per precision, the plugin's GEMM-only step: every product a step of its linears and 1x1
    convolutions needs (forward, input gradient, weight gradient: :func:`~mmplugin.analysis.gemm_floor.training_shapes`)
    timed alone at its shape on the faster of MKL and oneDNN (row ``GEMMs alone``), the part of a step that no
    fusion or layout change removes.

    Returns one dict per (implementation, precision): ``seconds`` (median step), ``ratio`` (speed over the first
    row of that precision), ``gemm_ratio`` (the plugin's seconds over its GEMM-only time; None for peers),
    ``peak_mib`` (None where not measured), ``mem_ratio`` (over the first row's).
    """
    from mmplugin.analysis.gemm_floor import gemm_calls, gemm_seconds, linear_shapes, training_shapes
    from mmplugin.analysis.memory import peak_memory, supports_checkpointing
    from mmplugin.analysis.peers import benchmark_models
    from mmplugin.models.layers import gemm as gemm_module
    torch.manual_seed(0)
    models = benchmark_models(family, arch, 'cpu')
    ref_out = None
    x = torch.randn(2, 3, *size)
    same = {}
    with torch.no_grad():
        for name, m in models.items():
            m.eval()  # mmdet's Swin.train() returns None: no chaining
            out = [o.detach() for o in m(x)]
            if ref_out is None:
                ref_out = out
            if len(out) == len(ref_out) and all(a.shape == b.shape for a, b in zip(out, ref_out)):
                same[name] = m  # the same function (shapes match), e.g. not a ResNet peer
    shapes = training_shapes(linear_shapes(models['mmplugin'], x))
    precisions = {'fp32': torch.float32, **({'bf16 autocast': torch.bfloat16} if bf16 else {})}
    fns = {(p, *key): fn for p, d in precisions.items() for key, fn in gemm_calls(shapes, d, bias=False).items()}
    dtypes = (None, torch.bfloat16)[:2 if bf16 else 1]

    def make_step(m, opt, dtype):
        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                outs = m(x)
            sum(o.float().mean() for o in outs).backward()
            opt.step()
        return step
    for name, m in same.items():
        if name.endswith('deploy'):
            continue  # a deployed model has no BatchNorm to train
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        for dtype in dtypes:
            fns[(name, 'bf16 autocast' if dtype else 'fp32')] = make_step(m, opt, dtype)
    if compiled and 'mmplugin' in same:
        for dtype in dtypes:  # a copy per precision: autocast would recompile one copy's graphs each step
            m = copy.deepcopy(same['mmplugin'])
            m.train()
            # static shapes: the same forward compiled before at another size (the inference rows) would otherwise
            # come back with symbolic sizes, which inductor's training graphs of SwiftFormer fail on (torch 2.13)
            m = torch.compile(m, backend='inductor', dynamic=False)
            step = make_step(m, torch.optim.AdamW(m.parameters(), lr=1e-4), dtype)
            t = time.perf_counter()
            step()
            print(f'  training step compiled ({dtype or torch.float32}) in {time.perf_counter() - t:.0f} s', flush=True)
            fns[(COMPILED_ROW, 'bf16 autocast' if dtype else 'fp32')] = step
    if gemm_module._AVAILABLE and 'mmplugin' in same:
        other = not gemm_module._ENABLED  # the kernel the plugin's step does not use

        def other_step(step=fns[('mmplugin', 'fp32')]):
            with gemm_module.onednn_training_gemms(other):
                step()
        fns[(ONEDNN_ROW if other else BLAS_ROW, 'fp32')] = other_step
    times = {}
    for p in precisions:
        # each precision in rounds of its own: an fp32 step interleaved with bf16 steps ran up to 1.4x slower than
        # interleaved with fp32 steps only (mmdet's Swin-T, AMD EPYC family 25 model 17), which skewed the ratios
        times.update(interleaved({key: fn for key, fn in fns.items()
                                  if (key[0] if key[1] == 'gemm' else key[1]) == p}, rounds))
    gemm = {p: gemm_seconds({key[1:]: times.pop(key) for key in list(times) if key[0] == p and key[1] == 'gemm'},
                            shapes)[0] for p in precisions}
    rows, first = [], {}
    for (name, precision), sec in times.items():
        first.setdefault(precision, sec)
        rows.append(dict(backbone=f'{family} {arch}', impl=name, precision=precision, seconds=sec,
                         ratio=first[precision] / sec,
                         gemm_ratio=sec / gemm[precision] if name in ('mmplugin', BLAS_ROW, ONEDNN_ROW, COMPILED_ROW)
                         else None,
                         peak_mib=None, mem_ratio=None, size=list(size)))
    for p, sec in gemm.items():
        rows.append(dict(backbone=f'{family} {arch}', impl='GEMMs alone (forward + both gradients)', precision=p,
                         seconds=sec, ratio=first[p] / sec, gemm_ratio=1.0, peak_mib=None, mem_ratio=None,
                         size=list(size)))
    if memory:
        names = list(dict.fromkeys([next(iter(same)), 'mmplugin']))
        base = None
        for name in names:
            for cp in (False, True):
                if cp and (name != 'mmplugin' or not supports_checkpointing(same[name])):
                    continue  # the plugin's checkpointing; the peers' is timed in the GPU rows only (suite time)
                mib = peak_memory(family, arch, name, size, cp, 'cpu')
                base = base or mib
                rows.append(dict(backbone=f'{family} {arch}', impl=name + (' with_cp' if cp else ''),
                                 precision='fp32 (memory)', seconds=None, ratio=None, gemm_ratio=None, peak_mib=mib,
                                 mem_ratio=mib / base, size=list(size)))
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


