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
        One dict per (implementation, runtime, precision): ``ms``, ``ratio`` (speed over the first peer's eager row
        in that precision; None where the family has no peer or the peer cannot run it), ``gemm_ratio`` (the
        plugin's time over its GEMMs alone in that precision), ``rel_err`` (max relative error of the outputs against
        the plugin's fp32 outputs; None for another network); a row that could not run has ``error`` instead.
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
    baseline = next(iter(peers), None)  # the peer a user would otherwise pick (mmdet's Swin, the official model)
    for prec in precisions:
        gemm = sum(times.pop(('gemm', s, prec)) for s in shapes)
        base = times.get((baseline, 'eager', prec))  # None: no peer, or it cannot run this precision
        rows.append(dict(backbone=f'{family} {arch}', impl='GEMMs alone', runtime='cuBLAS' if device.type == 'cuda'
                         else 'torch', precision=prec, ms=gemm * 1e3, ratio=None, gemm_ratio=1.0, rel_err=None))
        for key in [k for k in times if k[2] == prec]:
            name, runtime, _ = key
            sec = times[key]
            try:
                err = max_rel_error([o.float() for o in outs[key]], ref)
            except ValueError:  # another network (a ResNet peer): other outputs
                err = None
            rows.append(dict(backbone=f'{family} {arch}', impl=name, runtime=runtime, precision=prec, ms=sec * 1e3,
                             ratio=base / sec if base else None,
                             gemm_ratio=sec / gemm if name == 'mmplugin' else None, rel_err=err))
        rows += [dict(backbone=f'{family} {arch}', impl=k[0], runtime=k[1], precision=prec, ms=None, ratio=None,
                      gemm_ratio=None, rel_err=None, error=msg) for k, msg in failed.items() if k[2] == prec]
    return rows


def training_rows(family: str, arch: str, size, rounds: int, device, precisions=('fp32', 'bf16 autocast',
                  'fp16 autocast'), batch: int = 2) -> list[dict]:
    """Backbone training steps (forward + backward + AdamW, train mode, ``batch`` images of ``size``) of the plugin
    and the peers that compute the same function, same weights, per precision (fp16 with a GradScaler), interleaved;
    then each one's peak memory of a step alone (the timed models moved off the device first), with and without
    activation checkpointing.

    Returns one dict per (implementation, precision): ``ms`` (median step, None for the memory-only with_cp rows),
    ``ratio`` (speed over the first peer's; None without a peer), ``peak_mib`` (``max_memory_allocated`` during a
    step: the model, its optimizer state and the step; CUDA only), ``step_mib`` (that peak less what was allocated
    before the step with the gradients freed: activations, gradients, the update's temporaries), ``mem_ratio``
    (``step_mib`` over the first peer's, or over the plugin's own where the family has no peer).
    """
    from mmplugin.analysis.memory import enable_checkpointing, supports_checkpointing
    from mmplugin.analysis.peers import build_peers
    from mmplugin.models.backbones.base import get_family
    device = torch.device(device)
    torch.manual_seed(0)
    ours = get_family(family)(arch, drop_path_rate=0.0)
    peers = build_peers(family, arch, ours)
    x = torch.randn(batch, 3, *size, device=device)
    probe = torch.randn(1, 3, 64, 96)

    def shapes_of(m):
        m.eval()  # mmdet's Swin.train() returns None: no chaining
        with torch.no_grad():
            return [o.shape for o in m(probe)]

    ref = shapes_of(ours)
    same = {n: m for n, m in peers.items() if not n.endswith('deploy') and shapes_of(m) == ref}
    models = {**same, 'mmplugin': ours}
    baseline = next(iter(same), None)

    def loss_of(m):
        return sum(o.float().pow(2).mean() for o in m(x))

    fns = {}
    for name, m in models.items():
        m.to(device)
        m.train()
        for prec in precisions:
            fns[(name, prec)] = _training_step(m, loss_of, PRECISIONS[prec][0], device)
    with _true_fp32():
        for fn in fns.values():
            _until_updated(fn)  # fp16: the loss scale has settled, the timed steps update the weights
        times = interleaved(fns, rounds)
    _off_device(models, fns, device)
    rows, mib = [], {}
    for prec in precisions:
        for name, m in models.items():
            for cp in (False, True):
                if cp and not supports_checkpointing(m):
                    continue
                mm = copy.deepcopy(m).to(device)
                if cp:
                    enable_checkpointing(mm)
                with _true_fp32():
                    peak, during = _peak_of(_training_step(mm, loss_of, PRECISIONS[prec][0], device), device,
                                            run_off_device=cp)
                del mm
                ms = None if cp else times[(name, prec)] * 1e3
                base_ms = times.get((baseline, prec))
                mib[(name, cp, prec)] = during
                base_mib = mib.get((baseline or 'mmplugin', False, prec))
                rows.append(dict(backbone=f'{family} {arch}', impl=name + (' with_cp' if cp else ''),
                                 precision=prec, ms=ms, ratio=base_ms * 1e3 / ms if ms and base_ms else None,
                                 peak_mib=peak, step_mib=during,
                                 mem_ratio=during / base_mib if during is not None and base_mib else None,
                                 size=list(size), batch=batch))
    return rows


def _training_step(m, loss_of, amp, device):
    """One training step of ``m`` as a zero-argument function: AdamW, ``loss_of(m)`` under autocast in ``amp`` (fp16
    with a GradScaler), synchronised. Its optimizer and scaler are its ``opt`` and ``scaler`` attributes; it returns
    what ``loss_of`` returned."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

    def step():
        opt.zero_grad(set_to_none=True)
        with _autocast(device, amp):
            loss = loss_of(m)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        _sync(device)
        return loss
    step.opt, step.scaler = opt, scaler
    return step


def _until_updated(step, limit: int = 40) -> None:
    """Call ``step`` until its optimizer has updated the weights (it has state; no call if it has): an fp16
    GradScaler starts at 2^16 and skips the steps whose scaled gradients overflow, which neither update the weights
    nor allocate the optimizer's state."""
    for _ in range(limit):
        if step.opt.state:
            return
        step()
    if step.opt.state:
        return
    raise RuntimeError(f'no optimizer update in {limit} steps (every fp16 gradient overflowed or was not finite)')


def _off_device(models: dict, fns: dict, device) -> None:
    """Free the device for a memory measurement: the timed steps (their optimizer states) dropped, the models'
    gradients freed and the models moved to the CPU."""
    fns.clear()
    import gc
    for m in models.values():
        m.zero_grad(set_to_none=True)
        m.cpu()
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def _peak_of(step, device, run_off_device: bool = True) -> tuple[float | None, float | None]:
    """``(peak MiB, peak less what was allocated before it)`` of one weight-updating call of ``step`` (a
    :func:`_training_step`) on CUDA, after the optimizer state exists and with the gradients freed before it; a
    call the fp16 loss scaler skipped is measured again. Elsewhere Nones (the CPU figures come from fresh processes:
    :mod:`mmplugin.analysis.memory`), after one call if ``run_off_device`` (to run a code path the timed rows did
    not, e.g. activation checkpointing)."""
    if device.type != 'cuda':
        if run_off_device:
            step()
        return None, None
    _until_updated(step)
    for _ in range(5):
        step.opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before, scale = torch.cuda.memory_allocated(device), step.scaler.get_scale()
        step()
        peak = torch.cuda.max_memory_allocated(device)
        if step.scaler.get_scale() >= scale:  # not skipped (a skip halves the scale)
            break
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
    ``device``, per precision (fp16 with a GradScaler), interleaved; then each one's peak memory of a step alone (only
    the measured detector on the device), the plugin's also with activation checkpointing.

    Returns one dict per (implementation, precision): ``ms``, ``ratio`` (speed over mmdet's), ``losses`` (the first
    step's: the two agree where the sampling does), ``peak_mib`` / ``step_mib`` / ``mem_ratio`` (over mmdet's) as in
    :func:`training_rows`.
    """
    from mmplugin.analysis.detector_step import _num_classes, detector_pair, synthetic_batch
    device = torch.device(device)
    models = detector_pair(config)
    inputs, samples = synthetic_batch(size, batch, _num_classes(models['mmplugin']))
    inputs, samples = inputs.to(device), [s.to(device) for s in samples]
    logs = {}

    def loss_of(m):
        torch.manual_seed(1)  # the same anchor / RoI sampling in both detectors
        loss, log_vars = m.parse_losses(m.loss(inputs, samples))
        logs[m] = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}
        return loss

    fns, first = {}, {}
    for name, m in models.items():
        for prec in precisions:
            mm = copy.deepcopy(m).to(device)
            fns[(name, prec)] = step = _training_step(mm, loss_of, PRECISIONS[prec][0], device)
            with _true_fp32():
                step()
                first[(name, prec)] = logs[mm]  # the first step, from the same weights in both
                _until_updated(step)
    with _true_fp32():
        times = interleaved(fns, rounds)
    _off_device({}, fns, device)
    rows = []
    for prec in precisions:
        base_mib = None
        for name, cp in (('mmdet-swin', False), ('mmplugin', False), ('mmplugin', True)):
            m = copy.deepcopy(models[name]).to(device)
            if cp:
                m.backbone.set_grad_checkpointing(True)
            with _true_fp32():
                peak, during = _peak_of(_training_step(m, loss_of, PRECISIONS[prec][0], device), device,
                                        run_off_device=cp)
            del m
            logs.clear()
            ms = None if cp else times[(name, prec)] * 1e3
            base_mib = base_mib or during
            rows.append(dict(config=config, impl=name + (' with_cp' if cp else ''), precision=prec, ms=ms,
                             ratio=None if ms is None else times[('mmdet-swin', prec)] * 1e3 / ms,
                             losses=None if cp else first[(name, prec)], peak_mib=peak, step_mib=during,
                             mem_ratio=None if during is None else during / base_mib, size=list(size), batch=batch))
    return rows
