"""ExecuTorch ``.pte`` with the XNNPACK delegate (fp32), and a runner through ExecuTorch's Python runtime bindings.

Capture: ``torch.export`` at the example's fixed shape, then ``to_edge_transform_and_lower`` with the
``XnnpackPartitioner``: the ops XNNPACK takes run in its delegate segments, the rest in ExecuTorch's portable
kernels (SwiftFormer's additive attention is written so that each block is one segment; the necks' nearest
upsampling is rewritten exactly into ops XNNPACK takes, :mod:`mmplugin.export.rewrites`, so a SwiftFormer Semantic
FPN is one segment; Swin's window index arithmetic stays portable). Works with
executorch 1.5.1 (+ torchao 0.18) on torch 2.13; the model must be in deploy form
(:func:`mmplugin.export.backends.prepare`): XNNPACK takes only constant weights.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import nn

INSTALL = 'pip install "mmplugin[edge]" (executorch, torchao; keep your torch: see docs/deploy_edge.md)'


def missing() -> str | None:
    """None when ExecuTorch's exporter, XNNPACK partitioner and runtime bindings import, else the reason."""
    try:
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: F401
    except Exception as err:  # noqa: BLE001  (ImportError, or a compiled extension built for another torch)
        return f'ExecuTorch is not usable: {type(err).__name__}: {err}; {INSTALL}'
    return None


def graph_ops(edge_program) -> Counter:
    """``{op name: count}`` of the lowered graph's calls: ``executorch_call_delegate`` counts the XNNPACK segments,
    every other name an op left to the portable kernels."""
    ops = Counter()
    for node in edge_program.exported_program().graph_module.graph.nodes:
        if node.op != 'call_function' or 'getitem' in str(node.target):
            continue
        name = getattr(node.target, '__name__', str(node.target))
        ops[name.split('(')[0]] += 1
    return ops


def export(module: nn.Module, out: str, example: torch.Tensor) -> dict:
    """Lower ``module`` (deploy form, eval) with XNNPACK and write ``out`` (.pte).

    Returns ``delegates`` (number of XNNPACK segments) and ``portable_ops`` (``{op: count}`` outside them).
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from mmplugin.export.rewrites import for_delegates
    ep = for_delegates(torch.export.export(module, (example, )))
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    ops = graph_ops(edge)
    delegates = ops.pop('executorch_call_delegate', 0)
    if not delegates:
        raise RuntimeError('XNNPACK took no part of the graph')
    with open(out, 'wb') as f:
        f.write(edge.to_executorch().buffer)
    return dict(delegates=delegates, portable_ops=dict(ops))


def load(path: str, threads: int | None = None):
    """``runner(image) -> list of tensors`` executing the ``.pte``'s ``forward`` with the runtime bindings.

    ``threads``: XNNPACK's thread pool size (default: ExecuTorch's choice).
    """
    from executorch.runtime import Runtime

    if threads:
        _set_threads(threads)
    method = Runtime.get().load_program(path).load_method('forward')

    def run(x: torch.Tensor) -> list:
        return list(method.execute([x.contiguous()]))

    return run


def _set_threads(threads: int) -> None:
    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    except ImportError as err:
        raise ValueError(f'this ExecuTorch build cannot set its thread count ({err})') from None
    _unsafe_reset_threadpool(threads)
