"""How fast a backbone's own matrix products can run: every ``nn.Linear`` and 1x1 convolution timed alone at its exact
shape.

A share of "the matmul peak" (a 4096x4096 product) is a goal only as far as the network's GEMMs reach that peak at
their own shapes: thin ones (Swin's stage 1: 60,800 tokens by 96 channels at 800x1216) run far below it. This
records the ``(M, K, N)`` of every linear and every dense 1x1 convolution (stride 1, one group: a GEMM over the
``M = B * H * W`` pixels; SwiftFormer's MLPs) in one forward, then times ``F.linear`` on random operands of each
shape (medians of interleaved rounds), and the matmul peak in the same dtype and rounds:

    python -m mmplugin.analysis.gemm_floor swin:tiny 800x1216 bf16

Prints one line per shape (count, ms, GFLOP/s) and the total: the GEMM-only time and GFLOP/s, i.e. what the whole
network would reach if everything but its GEMMs were free, and the GEMMs' share of the network's MACs.
"""
from __future__ import annotations

import collections
import sys

import torch
import torch.nn.functional as F

__all__ = ['KERNELS', 'linear_shapes', 'training_shapes', 'gemm_call', 'gemm_calls', 'gemm_seconds', 'gemm_floor']


class _GemmShapes(torch.overrides.TorchFunctionMode):
    """Records ``(M, K, N)`` of every ``F.linear`` and dense 1x1 stride-1 ``F.conv2d`` call (modules or functional
    code alike: SwiftFormer calls its convolutions with folded weights)."""

    def __init__(self):
        super().__init__()
        self.shapes = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.linear:
            x, w = args[0], args[1] if len(args) > 1 else kwargs['weight']
            self.shapes[(x.numel() // x.shape[-1], w.shape[1], w.shape[0])] += 1
        elif func in (F.conv2d, torch.conv2d):
            w = args[1] if len(args) > 1 else kwargs['weight']
            stride = args[3] if len(args) > 3 else kwargs.get('stride', 1)
            groups = args[6] if len(args) > 6 else kwargs.get('groups', 1)
            if tuple(w.shape[2:]) == (1, 1) and groups == 1 and stride in (1, (1, 1), [1, 1]):
                self.shapes[(out.numel() // w.shape[0], w.shape[1], w.shape[0])] += 1
        return out


def linear_shapes(model: torch.nn.Module, x: torch.Tensor) -> collections.Counter:
    """``{(M, K, N): calls}`` of the linears and dense 1x1 convolutions (``M`` = rows, or batch x pixels) in one
    forward of ``model`` on ``x``, with oneDNN's fused convolutions off so that every convolution is a
    ``F.conv2d`` call (same shapes, same work)."""
    from mmplugin.models.layers.fusion import onednn_fusion_disabled
    mode = _GemmShapes()
    with torch.inference_mode(), onednn_fusion_disabled(), mode:
        model(x)
    return mode.shapes


def training_shapes(shapes: collections.Counter) -> collections.Counter:
    """The products of a training step, from the forward's ``{(M, K, N): calls}``: for ``Y = X W^T`` with ``X``
    ``(M, K)`` and ``W`` ``(N, K)``, the forward ``(M, K, N)``, the input gradient ``dX = dY W`` (``(M, N, K)``) and
    the weight gradient ``dW = dY^T X`` (``(N, M, K)``: a reduction over the ``M`` rows), each written as the
    ``(rows, reduction, columns)`` of one product. Three times the forward's FLOPs; the bias gradient (a sum) is
    not a GEMM."""
    out = collections.Counter()
    for (m, k, n), calls in shapes.items():
        for shape in ((m, k, n), (m, n, k), (n, m, k)):
            out[shape] += calls
    return out


KERNELS = ('mkl', 'onednn', 'onednn prepacked')


def gemm_call(m: int, k: int, n: int, dtype: torch.dtype, kernel: str, bias: bool = True):
    """A zero-argument ``(m, k) x (k, n)`` product (``+ bias`` unless ``bias=False``: the backward products have
    none) on random operands through ``kernel``: ``'mkl'`` is ``F.linear`` (torch's BLAS for fp32, MKL in the x86
    wheels), ``'onednn'`` oneDNN's own linear (``torch.ops.mkldnn._linear_pointwise``), ``'onednn prepacked'`` the
    same with the weight reordered into oneDNN's blocked layout beforehand (:mod:`mmplugin.models.layers.prepack`).
    On AMD CPUs MKL's fp32 GEMM can run at half oneDNN's, so the floor counts the fastest kernel at every shape."""
    a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    b = torch.randn(n, dtype=dtype) if bias else None
    if kernel == 'mkl':
        return lambda: F.linear(a, w, b)
    if kernel == 'onednn':
        return lambda: torch.ops.mkldnn._linear_pointwise(a, w, b, 'none', [], '')
    if kernel == 'onednn prepacked':
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 4096)
        return lambda: torch.ops.mkldnn._linear_pointwise(a, packed, b, 'none', [], '')
    raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')


def gemm_calls(shapes, dtype: torch.dtype, bias: bool = True) -> dict:
    """``{('gemm', (M, K, N), kernel): fn}`` for every shape and kernel: to time in the same interleaved rounds as
    the model, then :func:`gemm_seconds`."""
    return {('gemm', shape, kern): gemm_call(*shape, dtype, kern, bias) for shape in shapes for kern in KERNELS}


def gemm_seconds(times: dict, shapes: collections.Counter) -> tuple[float, dict]:
    """The GEMM-only time from :func:`gemm_calls`' timings: sum over shapes of ``calls x`` the faster kernel.
    Returns ``(seconds, {(M, K, N): (seconds of one call, kernel)})``."""
    best = {}
    for shape in shapes:
        kern = min(KERNELS, key=lambda k: times[('gemm', shape, k)])
        best[shape] = (times[('gemm', shape, kern)], kern)
    return sum(best[s][0] * calls for s, calls in shapes.items()), best


def gemm_floor(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype = torch.float32, repeats: int = 5) -> dict:
    """Time every linear shape of ``model`` (weights and input cast to ``dtype``) alone, on its faster kernel.

    Returns ``dict(shapes=[(M, K, N, calls, seconds, kernel)], gflop, seconds, gflops, peak_gflops, model_gflop)``:
    ``seconds`` the sum over calls, ``peak_gflops`` the 4096 product in ``dtype`` on its faster kernel
    (:func:`mmplugin.utils.timing.matmul_peak_call`), all timed in the same interleaved rounds (medians of
    ``repeats``); ``model_gflop`` the whole forward's work (:func:`mmplugin.analysis.complexity.flop_analyzer`,
    2 FLOP per MAC).
    """
    from mmplugin.analysis.complexity import flop_analyzer
    from mmplugin.utils.timing import interleaved, matmul_peak_call
    model = model.to(dtype).eval()
    with torch.no_grad():
        model_flop = 2 * flop_analyzer(model, x.to(dtype)).total()
    shapes = linear_shapes(model, x.to(dtype))
    fns = gemm_calls(shapes, dtype)
    for kern in KERNELS:
        fns[('matmul', kern)], peak_gflop = matmul_peak_call(dtype, kern)
    with torch.inference_mode():
        times = interleaved(fns, repeats)
    total, best = gemm_seconds(times, shapes)
    rows = [(m, k, n, calls, *best[(m, k, n)]) for (m, k, n), calls in sorted(shapes.items())]
    flop = sum(2 * m * k * n * calls for m, k, n, calls, *_ in rows)
    peak = peak_gflop / min(times[('matmul', kern)] for kern in KERNELS)
    return dict(shapes=rows, gflop=flop / 1e9, seconds=total, gflops=flop / total / 1e9, peak_gflops=peak,
                model_gflop=model_flop / 1e9)


def _main(argv) -> None:
    import argparse

    import mmplugin  # noqa: F401  (registers the families)
    from mmplugin.analysis.timing import parse_hw
    from mmplugin.models.backbones.registry import FAMILIES, get_family
    from mmplugin.utils.cpu import cpu_model
    p = argparse.ArgumentParser(prog='python -m mmplugin.analysis.gemm_floor', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('backbone', nargs='?', default='swin:tiny', help='FAMILY:ARCH (default swin:tiny)')
    p.add_argument('size', nargs='?', default='800x1216', help='HxW (default 800x1216)')
    p.add_argument('precision', nargs='?', default='bf16', choices=('bf16', 'fp32'))
    args = p.parse_args(argv)
    family, sep, arch = args.backbone.partition(':')
    if not sep or family not in FAMILIES:
        p.error(f'backbone must be FAMILY:ARCH with FAMILY one of {", ".join(FAMILIES)}, got {args.backbone!r}')
    try:
        hw = parse_hw(args.size)
    except ValueError as err:
        p.error(str(err))
    dtype = {'bf16': torch.bfloat16, 'fp32': torch.float32}[args.precision]
    torch.manual_seed(0)
    res = gemm_floor(get_family(family)(arch), torch.randn(1, 3, *hw), dtype)
    print(f'CPU: {cpu_model()}; {torch.get_num_threads()} threads; {args.backbone} {args.size} {args.precision}; '
          f'python -m mmplugin.analysis.gemm_floor {args.backbone} {args.size} {args.precision}')
    for m, k, n, calls, sec, kern in res['shapes']:
        print(f'M={m} K={k} N={n} x{calls}: {sec * 1e3:.2f} ms, {2 * m * k * n / sec / 1e9:.0f} GFLOP/s ({kern})')
    print(f"GEMMs: {res['gflop']:.1f} GFLOP ({res['gflop'] / res['model_gflop']:.0%} of the forward's "
          f"{res['model_gflop']:.1f}) in {res['seconds'] * 1e3:.0f} ms = {res['gflops']:.0f} GFLOP/s; "
          f"4096x4096 product {res['peak_gflops']:.0f} GFLOP/s ({res['gflops'] / res['peak_gflops']:.0%}); "
          f"the whole forward at most {res['model_gflop'] / res['seconds'] / res['peak_gflops']:.0%} of that peak "
          'if nothing but its GEMMs took time')


if __name__ == '__main__':
    _main(sys.argv[1:])
