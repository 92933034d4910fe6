"""Where an eager Semantic FPN's time goes: backbone, neck, decode head and the final resize, each timed alone
with its multiply-accumulates, against the fp32 matmul peak timed in the same rounds.

Why: a runtime's speed-up over eager is bounded by the share of eager time it can shorten. Dense 3x3
convolutions that eager oneDNN already runs near the matmul peak (the FPN neck and head at stride 4) leave a
runtime little to gain in fp32, whereas the backbone's small, memory-bound ops are where runtimes win; the final
bilinear resize of ``num_classes`` logits to the input size moves ``num_classes x H x W`` floats whatever the
precision. ``tools/edge_table.py --breakdown`` prints the table (docs/deploy_edge.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ['segmentor_breakdown', 'breakdown_table']

PARTS = ('backbone', 'neck', 'head', 'resize')


def segmentor_breakdown(name: str, size: int = 512, rounds: int = 10, threads: int = 2) -> dict:
    """Eager fp32 per-part figures of the segmentor ``name`` (:data:`mmplugin.analysis.bench.SEGMENTORS`) at batch 1,
    ``size x size``.

    Returns ``dict(rows=[dict(part, gmacs, ms, gflops, peak_share)], whole_ms, peak_gflops)``: ``part`` in
    :data:`PARTS` (``resize``: logits ``(1, K, H/4, W/4) -> (1, K, H, W)``; MACs as mmengine's ``FlopAnalyzer``
    counts them, so the parts add up to the whole model's count), ``whole_ms`` the whole model in the same rounds,
    ``peak_gflops`` the fp32 matmul peak (:func:`mmplugin.utils.timing.matmul_peak_call`) in the same rounds.
    """
    from mmplugin.analysis import bench
    from mmplugin.analysis.complexity import flop_analyzer
    from mmplugin.utils.timing import interleaved, matmul_peak_call
    if name not in bench.SEGMENTORS:
        raise ValueError(f'the breakdown is for segmentors {tuple(bench.SEGMENTORS)}, got {name!r}')
    torch.set_num_threads(threads)
    part = bench.build_part(name)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # not inference_mode: the analyzer's tracing takes these maps as inputs
        feats = tuple(part.backbone(x))
        pyramid = tuple(part.neck(feats))
        logits = part.head(pyramid)
    resize = _Resize(size, part.head.align_corners)
    calls = {'backbone': lambda: part.backbone(x), 'neck': lambda: part.neck(feats),
             'head': lambda: part.head(pyramid), 'resize': lambda: resize(logits)}
    macs = {'backbone': flop_analyzer(part.backbone, x).total(),
            'neck': flop_analyzer(part.neck, feats).total(),  # one argument: the tuple of maps
            'head': flop_analyzer(part.head, pyramid).total(), 'resize': flop_analyzer(resize, logits).total()}
    matmul, matmul_gflop = matmul_peak_call()
    fns = {**calls, 'whole': lambda: part(x), 'matmul': matmul}
    with torch.inference_mode():
        times = interleaved(fns, rounds)
    peak = matmul_gflop / times['matmul']
    rows = []
    for p in PARTS:
        gflops = 2 * macs[p] / times[p] / 1e9
        rows.append(dict(part=p, gmacs=macs[p] / 1e9, ms=times[p] * 1e3, gflops=gflops, peak_share=gflops / peak))
    return dict(rows=rows, whole_ms=times['whole'] * 1e3, peak_gflops=peak)


class _Resize(torch.nn.Module):
    """The segmentor's last step (``ExportPart`` ``'model'``): logits to the input size, bilinear."""

    def __init__(self, size: int, align_corners: bool):
        super().__init__()
        self.size, self.align_corners = size, align_corners

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return F.interpolate(logits, size=(self.size, self.size), mode='bilinear', align_corners=self.align_corners)


def breakdown_table(name: str, result: dict, size: int, threads: int, rounds: int) -> str:
    """Markdown table of :func:`segmentor_breakdown`'s result, with the CPU and settings in its header line."""
    from mmplugin.utils.cpu import cpu_model
    whole = result['whole_ms']
    lines = [f'{name}, eager fp32, CPU: {cpu_model()}; batch 1, {size}x{size}, {threads} thread(s), medians of '
             f'{rounds} rounds; fp32 matmul peak {result["peak_gflops"]:.0f} GFLOP/s; whole model {whole:.1f} ms',
             '', '| part | GMAC | ms | share of the whole | GFLOP/s | share of the matmul peak |',
             '|---|---:|---:|---:|---:|---:|']
    for r in result['rows']:
        lines.append(f'| {r["part"]} | {r["gmacs"]:.2f} | {r["ms"]:.1f} | {r["ms"] / whole:.0%} | {r["gflops"]:.0f} | '
                     f'{r["peak_share"]:.0%} |')
    return '\n'.join(lines)
