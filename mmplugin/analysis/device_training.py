"""Training rows on an accelerator (``tools/gpu_check.py``): backbone training steps of the plugin against its peers
and a whole Swin-T Mask R-CNN step with the plugin's backbone against mmdet's, timed interleaved per precision, and
the memory of one step of each model measured alone on the device.

Like :mod:`mmplugin.analysis.device_rows` every function takes the device (the CPU runs the code path at a tiny
size in CI; memory is measured on CUDA only). fp32 rows run with TF32 off.
"""
from __future__ import annotations

import copy

import torch

from mmplugin.analysis.device_rows import PRECISIONS, _autocast, _sync, _true_fp32
from mmplugin.utils.timing import interleaved

__all__ = ['training_rows', 'detector_rows']


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
