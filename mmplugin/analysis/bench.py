"""Side-by-side CPU latency of eager fp32 and the export runtimes, one process, for the edge table
(docs/deploy_edge.md; ``tools/edge_table.py`` is the command line).

For each model (SwiftFormer XS / S / L1 backbones, XS / L1 Semantic FPN segmentors; random weights: latency does
not depend on them) at batch 1 and a fixed size: export to each installed runtime, then time eager and every
runtime in interleaved rounds (:func:`mmplugin.utils.timing.interleaved`, medians), so a slow spell of a shared
machine hits all rows alike. Each row: ms, speed-up over eager fp32, max relative error against eager (fp32 rows)
or a task metric (rows that report one), file size; the header names the CPU.

More rows (e.g. int8 paths) come from row builders: ``fn(name, part, example, workdir) -> list[Row]``, appended
to :data:`ROW_BUILDERS` or named on the command line (``--rows module:function``). ``part`` is the eager fp32
model part, ``example`` the ``(1, 3, H, W)`` input; a builder exports what it needs into ``workdir``.
"""
from __future__ import annotations

import dataclasses
import importlib
import os.path as osp
from collections.abc import Callable, Sequence

import torch
from torch import nn

from mmplugin.export import backends

BACKBONES = {'swiftformer_xs': 'xs', 'swiftformer_s': 's', 'swiftformer_l1': 'l1'}
SEGMENTORS = {'swiftformer_xs_semfpn': 'swiftformer/swiftformer_xs_semfpn_40k_ade20k.py',
              'swiftformer_l1_semfpn': 'swiftformer/swiftformer_l1_semfpn_40k_ade20k.py'}
MODELS = (*BACKBONES, *SEGMENTORS)
FP32_RUNTIMES = ('onnx', 'executorch', 'litert')  # Core ML predicts on macOS only


@dataclasses.dataclass
class Row:
    """One timed runtime of one model. ``run(image) -> outputs``; ``rel_error`` is computed when None and
    ``metric`` is empty (fp32 rows); ``metric`` is a task-metric text for rows measured that way (int8)."""
    runtime: str
    run: Callable[[torch.Tensor], object]
    bytes: int | None = None
    rel_error: float | None = None
    metric: str = ''
    ms: float | None = None


RowBuilder = Callable[[str, nn.Module, torch.Tensor, str], Sequence[Row]]
ROW_BUILDERS: list[RowBuilder] = []


def row_builder(spec: str) -> RowBuilder:
    """``'package.module:function'`` -> the function (for ``--rows``)."""
    mod, sep, fn = spec.partition(':')
    if not sep or not fn:
        raise ValueError(f"a row builder is named 'module:function', got {spec!r}")
    return getattr(importlib.import_module(mod), fn)


def build_part(name: str) -> nn.Module:
    """Eval-mode fp32 model part, image ``(1, 3, H, W)`` in, a tuple of tensors out: the backbone's 4 maps or the
    segmentor's logits at the input size (:class:`mmplugin.export.ExportPart` ``'model'``)."""
    from mmplugin.export import ExportPart
    if name in BACKBONES:
        from mmplugin.models import SwiftFormer
        torch.manual_seed(0)
        return SwiftFormer(BACKBONES[name]).eval()
    if name not in SEGMENTORS:
        raise ValueError(f'unknown model {name!r}; choose from {MODELS}')
    from mmengine.config import Config
    from mmengine.registry import MODELS as REGISTRY
    from mmengine.registry import init_default_scope
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    cfg = Config.fromfile(osp.join(root, 'configs', SEGMENTORS[name]))
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    cfg.model.backbone.pop('init_cfg', None)
    cfg.model.pop('auxiliary_head', None)
    torch.manual_seed(0)
    return ExportPart(REGISTRY.build(cfg.model).eval(), 'model').eval()


def runtime_rows(name: str, part: nn.Module, example: torch.Tensor, workdir: str, runtimes: Sequence[str],
                 threads: int) -> tuple[list[Row], list[str]]:
    """One fp32 row per installed runtime; returns ``(rows, notes)`` (notes: runtimes skipped or failed, why)."""
    rows, notes = [], []
    for rt in runtimes:
        reason = backends.available(rt)
        if reason:
            notes.append(f'{name} {rt}: skipped ({reason})')
            continue
        path = osp.join(workdir, f'{name}{backends.SUFFIX[rt]}')
        try:
            # ONNX exports dynamic sizes from a batch-2 example (torch.export fixes size-1 dims)
            info = backends.export(part, rt, path, torch.cat([example, example]) if rt == 'onnx' else example)
            rows.append(Row(f'{rt} fp32', backends.load(rt, path, threads), info['bytes']))
        except (backends.BackendExportError, backends.BackendUnavailable, RuntimeError) as err:
            notes.append(f'{name} {rt}: failed ({str(err)[:300]})')
    return rows, notes


def measure(name: str, size: int = 512, rounds: int = 10, threads: int = 2, workdir: str = '.',
            runtimes: Sequence[str] = FP32_RUNTIMES,
            builders: Sequence[RowBuilder] = ()) -> tuple[list[Row], list[str]]:
    """Rows (eager first) for model ``name`` at ``size x size`` with every row's ``ms`` (median of ``rounds``)."""
    from mmplugin.export import flatten_outputs
    from mmplugin.utils.numerics import max_rel_error
    from mmplugin.utils.timing import interleaved
    torch.set_num_threads(threads)
    part = build_part(name)
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = flatten_outputs(part(example))

    def eager(x):
        with torch.inference_mode():
            return part(x)

    rows, notes = runtime_rows(name, part, example, workdir, runtimes, threads)
    for build in (*ROW_BUILDERS, *builders):
        rows.extend(build(name, part, example, workdir))
    rows.insert(0, Row('eager fp32', eager, None, 0.0))
    for row in rows:
        if row.rel_error is None and not row.metric:
            row.rel_error = max_rel_error(flatten_outputs(row.run(example)), ref)
    times = interleaved({i: (lambda r=row: r.run(example)) for i, row in enumerate(rows)}, rounds, settle=0.3)
    for i, row in enumerate(rows):
        row.ms = times[i] * 1e3
    return rows, notes


def table(results: dict[str, list[Row]], size: int, threads: int, rounds: int) -> str:
    """Markdown table of :func:`measure` results, with the CPU, size, threads and rounds in the header line."""
    from mmplugin.inference.allocator import retained
    from mmplugin.utils.cpu import cpu_model
    memory = '; freed memory retained in the process' if retained() else ''
    lines = [f'CPU: {cpu_model()}; batch 1, {size}x{size}, {threads} thread(s), medians of {rounds} rounds; '
             f'torch {torch.__version__}{memory}', '',
             '| model | runtime | ms | speed-up vs eager fp32 | max rel. error / metric | file MB |',
             '|---|---|---:|---:|---|---:|']
    for name, rows in results.items():
        eager = rows[0].ms
        for row in rows:
            acc = row.metric or f'{row.rel_error:.1e}'
            mb = '' if row.bytes is None else f'{row.bytes / 2**20:.1f}'
            lines.append(f'| {name} | {row.runtime} | {row.ms:.1f} | {eager / row.ms:.2f}x | {acc} | {mb} |')
    return '\n'.join(lines)
