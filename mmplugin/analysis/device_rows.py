"""The speed table's backbone rows on an accelerator (``tools/gpu_check.py``): the plugin against its peers with the
same weights, in every precision the device runs natively, beside its own GEMMs alone; training steps with their
peak memory; and which attention kernel served the Swin window attention.

Every function takes the device, so the same code runs on the CPU at a tiny size (``gpu_check --cpu-smoke``, CI).
Timings are medians of interleaved rounds (:func:`mmplugin.utils.timing.interleaved`); every timed call
synchronises the device before it returns. fp32 rows run with TF32 off (true fp32 products), as the CPU rows do.
"""
from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F

from mmplugin.utils.timing import interleaved

__all__ = ['PRECISIONS', 'inference_rows', 'training_rows', 'attention_kernels', 'detector_rows']

#: precision name -> (autocast dtype or None, model dtype or None)
PRECISIONS = {
    'fp32': (None, None),
    'bf16 autocast': (torch.bfloat16, None),
    'fp16 autocast': (torch.float16, None),
    'fp16 model': (None, torch.float16),
}


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _true_fp32():
    """TF32 off for matmuls and convolutions (restored after)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _gemm_call(shape, calls: int, dtype, device, bias: bool):
    """``calls`` products of one ``(M, K, N)`` shape in a row, then one synchronisation (so that a small product's
    time is not its launch + sync latency alone)."""
    m, k, n = shape
    a, w = torch.randn(m, k, dtype=dtype, device=device), torch.randn(n, k, dtype=dtype, device=device)
    b = torch.randn(n, dtype=dtype, device=device) if bias else None

    def fn():
        for _ in range(calls):
            F.linear(a, w, b)
        _sync(device)
    return fn


def inference_rows(family: str, arch: str, size, rounds: int, device, precisions=tuple(PRECISIONS),
                   compiled=(), batch: int = 1, compile_mode: str | None = None) -> list[dict]:
    """Eval forwards of the plugin backbone and its peers (same weights) on ``device``, per precision, with the
    plugin's GEMMs alone in the same rounds.

    Args:
        precisions: names of :data:`PRECISIONS`.
        compiled: precisions (a subset of ``precisions``) that also get a ``torch.compile`` row of the plugin
            (inductor, static shape, ``compile_mode``: e.g. ``'reduce-overhead'`` replays CUDA graphs, which removes
            the launch latency that bounds a batch-1 forward of a GPU this size).

    Returns:
        One dict per (implementation, runtime, precision): ``ms``, ``ratio`` (speed over the first peer's in that
        precision), ``gemm_ratio`` (the plugin's time over its GEMMs alone in that precision), ``rel_err`` (max
        relative error of the outputs against the plugin's fp32 outputs; None for another network).
    """
    from mmplugin.analysis.gemm_floor import linear_shapes
    from mmplugin.analysis.peers import build_peers
    from mmplugin.models.backbones.base import get_family
    from mmplugin.utils.numerics import max_rel_error
    device = torch.device(device)
    torch.manual_seed(0)
    ours = get_family(family)(arch).eval()
    peers = build_peers(family, arch, ours)
    x_cpu = torch.randn(batch, 3, *size)
    shapes = linear_shapes(ours, x_cpu)  # the GEMMs of one forward: the same on every device
    models = {**peers, 'mmplugin': ours}
    for m in models.values():
        m.to(device)
        m.eval()  # mmdet's Swin.train() returns None: no chaining
    x = x_cpu.to(device)
    with torch.no_grad(), _true_fp32():
        ref = [o.float() for o in ours(x)]
    fns, outs = {}, {}
    for prec in precisions:
        amp, model_dtype = PRECISIONS[prec]
        for name, m in models.items():
            if model_dtype is not None:
                m = copy.deepcopy(m).to(model_dtype)
            xin = x.to(model_dtype) if model_dtype is not None else x

            def fn(m=m, xin=xin, amp=amp, key=(name, 'eager', prec)):
                with torch.no_grad(), _autocast(device, amp):
                    outs[key] = m(xin)
                _sync(device)
            fns[(name, 'eager', prec)] = fn
        if prec in compiled:
            m = ours if model_dtype is None else copy.deepcopy(ours).to(model_dtype)
            cm = torch.compile(m, dynamic=False, mode=compile_mode)
            xin = x.to(model_dtype) if model_dtype is not None else x

            def cfn(cm=cm, xin=xin, amp=amp, key=('mmplugin', 'compiled', prec)):
                with torch.no_grad(), _autocast(device, amp):
                    outs[key] = [o.clone() for o in cm(xin)]  # a CUDA graph's next replay overwrites its outputs
                _sync(device)
            fns[('mmplugin', 'compiled', prec)] = cfn
        dtype = amp or model_dtype or torch.float32
        for shape, calls in shapes.items():
            fns[('gemm', shape, prec)] = _gemm_call(shape, calls, dtype, device, bias=True)
    failed = {}
    with _true_fp32():
        for key in [k for k in fns if k[0] != 'gemm']:
            try:  # a peer that cannot run a precision (mmdet's Swin as an fp16 model) gets a row saying why
                fns[key]()
            except RuntimeError as err:
                failed[key] = str(err).splitlines()[0][:160]
                del fns[key]
        times = interleaved(fns, rounds)
    rows = []
    for prec in precisions:
        gemm = sum(times.pop(('gemm', s, prec)) for s in shapes)
        first = None
        rows.append(dict(backbone=f'{family} {arch}', impl='GEMMs alone', runtime='cuBLAS' if device.type == 'cuda'
                         else 'torch', precision=prec, ms=gemm * 1e3, ratio=None, gemm_ratio=1.0, rel_err=None))
        for key in [k for k in times if k[2] == prec]:
            name, runtime, _ = key
            sec = times[key]
            first = first or sec
            try:
                err = max_rel_error([o.float() for o in outs[key]], ref)
            except ValueError:  # another network (a ResNet peer): other outputs
                err = None
            rows.append(dict(backbone=f'{family} {arch}', impl=name, runtime=runtime, precision=prec, ms=sec * 1e3,
                             ratio=first / sec, gemm_ratio=sec / gemm if name == 'mmplugin' else None, rel_err=err))
        rows += [dict(backbone=f'{family} {arch}', impl=k[0], runtime=k[1], precision=prec, ms=None, ratio=None,
                      gemm_ratio=None, rel_err=None, error=msg) for k, msg in failed.items() if k[2] == prec]
    return rows


def training_rows(family: str, arch: str, size, rounds: int, device, precisions=('fp32', 'bf16 autocast',
                  'fp16 autocast'), batch: int = 2) -> list[dict]:
    """Backbone training steps (forward + backward + AdamW, train mode, ``batch`` images of ``size``) of the plugin
    and the peers that compute the same function, same weights, per precision (fp16 with a GradScaler), interleaved;
    then each one's peak memory of a step alone, with and without activation checkpointing.

    Returns one dict per (implementation, precision): ``ms`` (median step, None for the memory-only with_cp rows),
    ``ratio`` (speed over the first row of that precision), ``peak_mib`` (``max_memory_allocated`` during a step,
    weights and optimizer state included; CUDA only), ``step_mib`` (that peak less what was allocated before the
    step: activations, gradients and temporaries), ``mem_ratio`` (``step_mib`` over the first row's).
    """
    from mmplugin.analysis.memory import enable_checkpointing, supports_checkpointing
    from mmplugin.analysis.peers import build_peers
    from mmplugin.models.backbones.base import get_family
    device = torch.device(device)
    torch.manual_seed(0)
    ours = get_family(family)(arch, drop_path_rate=0.0)
    peers = build_peers(family, arch, ours)
    x = torch.randn(batch, 3, *size, device=device)
    def shapes_of(m):
        m.eval()  # mmdet's Swin.train() returns None: no chaining
        with torch.no_grad():
            return [o.shape for o in m(x.cpu())]

    ref = shapes_of(ours)
    same = {n: m for n, m in peers.items() if not n.endswith('deploy') and shapes_of(m) == ref}
    models = {**same, 'mmplugin': ours}

    def make_step(m, amp):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

        def step():
            opt.zero_grad(set_to_none=True)
            with _autocast(device, amp):
                outs = m(x)
            scaler.scale(sum(o.float().pow(2).mean() for o in outs)).backward()
            scaler.step(opt)
            scaler.update()
            _sync(device)
        return step

    fns, steps = {}, {}
    for name, m in models.items():
        m.to(device)
        m.train()
        for prec in precisions:
            steps[(name, prec)] = fns[(name, prec)] = make_step(m, PRECISIONS[prec][0])
    with _true_fp32():
        times = interleaved(fns, rounds)
    rows, first_ms, first_mib = [], {}, {}
    for prec in precisions:
        for name, m in models.items():
            for cp in (False, True):
                if cp and not supports_checkpointing(m):
                    continue
                mm = copy.deepcopy(m)
                if cp:
                    enable_checkpointing(mm)
                step = make_step(mm, PRECISIONS[prec][0])
                with _true_fp32():
                    peak, during = _peak_of(step, device, run_off_device=cp)
                del mm, step
                ms = None if cp else times[(name, prec)] * 1e3
                first_ms.setdefault(prec, ms)
                first_mib.setdefault(prec, during)
                rows.append(dict(backbone=f'{family} {arch}', impl=name + (' with_cp' if cp else ''),
                                 precision=prec, ms=ms, ratio=None if ms is None else first_ms[prec] / ms,
                                 peak_mib=peak, step_mib=during,
                                 mem_ratio=None if during is None else during / first_mib[prec],
                                 size=list(size), batch=batch))
    return rows


def _peak_of(step, device, run_off_device: bool = True) -> tuple[float | None, float | None]:
    """``(peak MiB, peak less the memory allocated before the step)`` of the second of two calls of ``step`` (the
    optimizer state exists after the first) on CUDA. Elsewhere Nones (the CPU figures come from fresh processes:
    :mod:`mmplugin.analysis.memory`), after one call if ``run_off_device`` (to run a code path the timed rows did
    not, e.g. activation checkpointing)."""
    if device.type != 'cuda':
        if run_off_device:
            step()
        return None, None
    step()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    peak = torch.cuda.max_memory_allocated(device)
    return peak / 2**20, (peak - before) / 2**20


ATTENTION_OPS = ('scaled_dot_product', 'flash', 'efficient_attention', 'cudnn_attention', 'softmax', 'baddbmm',
                 'bmm')


def attention_kernels(family: str, arch: str, size, device, precision: str, train: bool = False) -> list[str]:
    """The attention-related aten operators (SDPA's backend ops, or softmax + batched products where SDPA is not
    used) in one profiled forward (and backward with ``train``) of the plugin's backbone: which kernel ran the
    window attention with its position bias and shift mask."""
    from torch.profiler import ProfilerActivity, profile

    from mmplugin.models.backbones.base import get_family
    device = torch.device(device)
    torch.manual_seed(0)
    amp, model_dtype = PRECISIONS[precision]
    m = get_family(family)(arch, drop_path_rate=0.0).to(device)
    m.train(train)
    x = torch.randn(1, 3, *size, device=device)
    if model_dtype is not None:
        m, x = m.to(model_dtype), x.to(model_dtype)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=acts) as prof, _true_fp32():
        with torch.set_grad_enabled(train), _autocast(device, amp):
            outs = m(x)
        if train:
            sum(o.float().mean() for o in outs).backward()
        _sync(device)
    return sorted({e.key for e in prof.key_averages()
                   if e.key.startswith('aten::') and any(s in e.key for s in ATTENTION_OPS)})


def detector_rows(config: str, size, rounds: int, device, precisions=('fp32', 'bf16 autocast', 'fp16 autocast'),
                  batch: int = 2) -> list[dict]:
    """A whole detector's training step with the plugin's Swin against the same detector with mmdet's
    ``SwinTransformer`` (:func:`mmplugin.analysis.detector_step.detector_pair`: same weights, batch and sampling) on
    ``device``, per precision (fp16 with a GradScaler), interleaved; then each one's peak memory of a step alone, the
    plugin's also with activation checkpointing.

    Returns one dict per (implementation, precision): ``ms``, ``ratio`` (speed over mmdet's), ``losses`` (the first
    step's: the two agree where the sampling does), ``peak_mib`` / ``step_mib`` / ``mem_ratio`` as in
    :func:`training_rows`.
    """
    from mmplugin.analysis.detector_step import _num_classes, detector_pair, synthetic_batch
    device = torch.device(device)
    models = detector_pair(config)
    inputs, samples = synthetic_batch(size, batch, _num_classes(models['mmplugin']))
    inputs, samples = inputs.to(device), [s.to(device) for s in samples]

    def make_step(m, amp):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

        def step():
            torch.manual_seed(1)  # the same anchor / RoI sampling in both detectors
            opt.zero_grad(set_to_none=True)
            with _autocast(device, amp):
                loss, log_vars = m.parse_losses(m.loss(inputs, samples))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            _sync(device)
            return {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}
        return step

    fns, first = {}, {}
    for name, m in models.items():
        m.to(device)
        for prec in precisions:
            fns[(name, prec)] = make_step(copy.deepcopy(m), PRECISIONS[prec][0])
            with _true_fp32():
                first[(name, prec)] = fns[(name, prec)]()
    with _true_fp32():
        times = interleaved(fns, rounds)
    del fns
    rows = []
    for prec in precisions:
        base_ms = base_mib = None
        for name, cp in (('mmdet-swin', False), ('mmplugin', False), ('mmplugin', True)):
            m = copy.deepcopy(models[name])
            if cp:
                m.backbone.set_grad_checkpointing(True)
            step = make_step(m, PRECISIONS[prec][0])
            with _true_fp32():
                peak, during = _peak_of(step, device, run_off_device=cp)
            del m, step
            ms = None if cp else times[(name, prec)] * 1e3
            base_ms = base_ms or ms
            base_mib = base_mib or during
            rows.append(dict(config=config, impl=name + (' with_cp' if cp else ''), precision=prec, ms=ms,
                             ratio=None if ms is None else base_ms / ms, losses=None if cp else first[(name, prec)],
                             peak_mib=peak, step_mib=during,
                             mem_ratio=None if during is None else during / base_mib, size=list(size), batch=batch))
    return rows
