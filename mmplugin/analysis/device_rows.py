"""The speed table's backbone rows on an accelerator (``tools/gpu_check.py``): the plugin's eval forward against its
peers with the same weights, in every precision the device runs natively, beside its own GEMMs alone; and which
attention kernel served the Swin window attention. Training steps and their memory:
:mod:`mmplugin.analysis.device_training`.

Every function takes the device, so the same code runs on the CPU at a tiny size (``gpu_check --cpu-smoke``, CI).
Timings are medians of interleaved rounds (:func:`mmplugin.utils.timing.interleaved`); every timed call
synchronises the device before it returns. fp32 rows run with TF32 off (true fp32 products), as the CPU rows do.
"""
from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F

from mmplugin.analysis.timing import _sync  # noqa: F401  (device_training uses it from here too)
from mmplugin.utils.timing import interleaved

__all__ = ['PRECISIONS', 'inference_rows', 'attention_kernels']

#: precision name -> (autocast dtype or None, model dtype or None)
PRECISIONS = {
    'fp32': (None, None),
    'bf16 autocast': (torch.bfloat16, None),
    'fp16 autocast': (torch.float16, None),
    'fp16 model': (None, torch.float16),
}


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


ATTENTION_OPS = ('scaled_dot_product', 'flash', 'efficient_attention', 'cudnn_attention', 'softmax', 'baddbmm',
                 'bmm')


WINDOW_ATTENTION_KERNEL = 'mmplugin::window_attention'  # the plugin's fused CPU inference kernel (mmplugin.ops)


def attention_kernels(family: str, arch: str, size, device, precision: str, train: bool = False) -> list[str]:
    """The attention-related operators (SDPA's backend ops, softmax + batched products where SDPA is not used, or
    the plugin's fused CPU inference kernel) in one profiled forward (and backward with ``train``) of the plugin's
    backbone: which kernel ran the window attention with its position bias and shift mask."""
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
                   if (e.key.startswith('aten::') and any(s in e.key for s in ATTENTION_OPS))
                   or e.key == WINDOW_ATTENTION_KERNEL})
