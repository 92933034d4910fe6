"""The device rows (:mod:`mmplugin.analysis.device_rows`, :mod:`mmplugin.analysis.device_training`) as
``tools/gpu_check.py`` runs, prints and saves them: one markdown table per backbone and measurement, printed as it
is measured, the report saved after each.

On the CPU (``gpu_check --cpu-smoke``, CI) the same code runs at 64x96 on the smallest arch of each family, one
round, fp32 and bf16 autocast (training fp32 only): it checks the code path, not the speed.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ['backbone_report', 'detector_pair_report', 'print_rows']


def print_rows(title: str, rows: list[dict], cols) -> None:
    """``rows`` as a markdown table of ``cols`` under ``title`` (``-`` for a missing value)."""
    def cell(v):
        if v is None:
            return '-'
        if isinstance(v, float):
            return f'{v:.3g}' if abs(v) < 0.01 else f'{v:.2f}'
        return str(v)
    print(f'\n{title}\n| ' + ' | '.join(cols) + ' |\n|' + '---|' * len(cols))
    for r in rows:
        print('| ' + ' | '.join(cell(r.get(c)) for c in cols) + ' |')


def backbone_report(specs, device: torch.device, save: Callable[[], None], out: dict, infer_size: str = '800x1216',
                    train_size: str = '512x768', rounds: int = 10, compiled=(), compile_mode: str | None = None
                    ) -> dict:
    """For each ``FAMILY:ARCH`` of ``specs``: eval rows at ``infer_size`` (batch 1) in every precision ``device``
    runs natively, ``compiled`` of them with a ``torch.compile`` row too; training rows at ``train_size``
    (batch 2); for Swin families, the attention operators of each forward and training step. Fills and returns
    ``out[spec] = {'inference': rows, 'training': rows, 'attention': {...}}``, calling ``save()`` after each."""
    from mmplugin.analysis import device_rows, device_training
    from mmplugin.analysis.timing import parse_hw
    from mmplugin.models.backbones.base import FAMILIES
    smoke = device.type == 'cpu'
    infer, train = ((64, 96), (64, 96)) if smoke else (parse_hw(infer_size), parse_hw(train_size))
    if smoke:
        precisions, train_precisions, rounds = ['fp32', 'bf16 autocast'], ['fp32'], 1
    else:
        bf16 = device.type == 'cuda' and torch.cuda.get_device_capability(device)[0] >= 8
        precisions = [p for p in device_rows.PRECISIONS if bf16 or 'bf16' not in p]
        train_precisions = [p for p in precisions if p != 'fp16 model']
    skipped = [c for c in compiled if c not in precisions]
    if skipped:
        print(f'  --compile {", ".join(skipped)}: not a precision this device runs natively; no compiled row')
    for spec in specs:
        family, _, arch = spec.partition(':')
        if smoke:
            arch = FAMILIES[family].smallest_arch()
        entry = out.setdefault(spec, {})
        entry['inference'] = rows = device_rows.inference_rows(
            family, arch, infer, rounds, device, precisions, compiled=[c for c in compiled if c in precisions],
            compile_mode=None if smoke else compile_mode)
        print_rows(f'{spec} eval forward, batch 1, {infer[0]}x{infer[1]}', rows,
                   ('impl', 'runtime', 'precision', 'ms', 'ratio', 'gemm_ratio', 'rel_err', 'error'))
        save()
        entry['training'] = rows = device_training.training_rows(family, arch, train, rounds, device,
                                                                 train_precisions)
        print_rows(f'{spec} training step, batch 2, {train[0]}x{train[1]}', rows,
                   ('impl', 'precision', 'ms', 'ratio', 'peak_mib', 'step_mib', 'mem_ratio'))
        save()
        if family.startswith('swin'):
            entry['attention'] = {
                f'{p} {"train" if t else "eval"}': device_rows.attention_kernels(
                    family, arch, train if t else infer, device, p, train=t)
                for p in precisions for t in (False, True) if not (t and p not in train_precisions)}
            for k, v in entry['attention'].items():
                print(f'  {spec} attention ops, {k}: {", ".join(v)}')
            save()
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    return out


def detector_pair_report(config: str, device: torch.device, size, steps: int, batch: int,
                         precisions=('fp32', 'bf16 autocast', 'fp16 autocast')) -> list[dict]:
    """The Swin-T Mask R-CNN training step of ``config`` with the plugin's backbone against mmdet's (same weights,
    batch and sampling), interleaved over ``steps`` rounds, per precision (names of
    :data:`~mmplugin.analysis.device_rows.PRECISIONS`), with peak memory
    (:func:`mmplugin.analysis.device_training.detector_rows`); on the CPU one fp32 round at batch 1."""
    from mmplugin.analysis import device_training
    smoke = device.type == 'cpu'
    rows = device_training.detector_rows(config, size, 1 if smoke else steps, device,
                                         ['fp32'] if smoke else list(precisions), batch=1 if smoke else batch)
    print_rows(f'Swin-T Mask R-CNN training step, batch {rows[0]["batch"]}, {size[0]}x{size[1]}', rows,
               ('impl', 'precision', 'ms', 'ratio', 'peak_mib', 'step_mib', 'mem_ratio'))
    return rows
