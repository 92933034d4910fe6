"""Exact export-time rewrites of ops a mobile delegate would leave to slow fallback kernels.

The FPN necks' top-down pathway upsamples by an integer factor with ``mode='nearest'``. XNNPACK has no
nearest-neighbour resize, so ExecuTorch runs each ``upsample_nearest2d`` in its portable, single-threaded kernel
and splits the graph into separate delegate segments around it (4 segments and 3 portable upsamples for a
Semantic FPN). At an integer factor ``s`` nearest upsampling is pure replication, ``y[..., i, j] =
x[..., i // s, j // s]``, which reshape + concatenation express exactly; XNNPACK takes both, so the whole
network becomes one delegate segment.

:func:`for_delegates` applies the rewrites to a ``torch.export`` program; non-integer factors keep the original
op. The values are bit-identical (tests/export/test_edge_export.py compares against ``F.interpolate``).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

aten = torch.ops.aten

__all__ = ['nearest_by_replication', 'DECOMPOSITIONS', 'for_delegates']


def _integer_factors(in_hw: Sequence[int], out_hw: Sequence[int]) -> tuple[int, int] | None:
    factors = []
    for i, o in zip(in_hw, out_hw):
        if i <= 0 or o % i:
            return None
        factors.append(o // i)
    return factors[0], factors[1]


def _replicate(y: torch.Tensor, copies: int, dim: int) -> torch.Tensor:
    # ``y * 1.0`` (exact) instead of ``[y] * copies``: XNNPACK's concatenation counts distinct inputs, and a
    # tensor concatenated with itself would stay outside the delegate
    return torch.cat([y] + [y * 1.0 for _ in range(copies - 1)], dim) if copies > 1 else y


def nearest_by_replication(x: torch.Tensor, output_size: Sequence[int] | None,
                           scale_factors: Sequence[float] | None) -> torch.Tensor:
    """``aten.upsample_nearest2d.vec`` for ``x (B, C, H, W)``: at integer factors ``(sh, sw)`` the output
    ``(B, C, sh * H, sw * W)`` built by replicating columns then rows (4-D reshapes and concatenations only);
    otherwise the original op at the output size."""
    b, c, h, w = x.shape
    if output_size is not None:
        oh, ow = (int(v) for v in output_size)
    else:
        oh, ow = int(h * scale_factors[0]), int(w * scale_factors[1])
    factors = _integer_factors((h, w), (oh, ow))
    if factors is None:
        return aten.upsample_nearest2d.default(x, [oh, ow])
    sh, sw = factors
    cols = _replicate(x.reshape(b, c * h, w, 1), sw, 3)  # (B, C*H, W, sw): column j repeated sw times
    rows = _replicate(cols.reshape(b * c, h, 1, ow), sh, 2)  # (B*C, H, sh, sw*W): row i repeated sh times
    return rows.reshape(b, c, oh, ow)


#: op -> exact replacement, for ``ExportedProgram.run_decompositions``
DECOMPOSITIONS = {aten.upsample_nearest2d.vec: nearest_by_replication}


def for_delegates(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with the ops of :data:`DECOMPOSITIONS` replaced (the other ops are left as they are); the
    program itself when it has none of them (re-tracing costs seconds, and a program already rewritten, e.g. a
    quantised graph exported again for lowering, has none)."""
    if not any(node.target in DECOMPOSITIONS for node in program.graph.nodes):
        return program
    return program.run_decompositions(DECOMPOSITIONS)
