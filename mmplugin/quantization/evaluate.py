"""Task metrics and speed of the int8 paths: the same checkpoint, the same validation split, fp32 against int8.

* :func:`calibration_images` runs the config's *training* split through its test pipeline and the model's data
  preprocessor: ``(1, 3, H, W)`` tensors as the model sees them (the validation split is never used to calibrate);
* :func:`build_int8_part` quantises a part (``backbone`` | ``backbone+neck`` | ``model``) for ``xnnpack`` (PT2E,
  ExecuTorch ``.pte``, run through its runtime) or ``onnxruntime`` (static QDQ) and returns a runner;
* :func:`install_int8` puts such a runner inside an mmdet / mmseg model: the backbone is replaced by the int8
  part (batches run image by image, the programs have a fixed shape) and the neck by a pass-through, so the heads
  and the whole post-processing stay the model's own, in float;
* :func:`evaluate_int8` evaluates the model with mmengine's test loop before and after: the metric dicts;
* :func:`int8_rows` times eager fp32 against each int8 runtime, alternating in one process (medians).
"""
from __future__ import annotations

import copy
import os
import os.path as osp
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from mmplugin.quantization.pt2e import PteRunner, cosine, default_keep_float, export_xnnpack, int8_ready, quantize_pt2e

BACKENDS = ('xnnpack', 'onnxruntime')
INT8_PARTS = ('backbone', 'backbone+neck')

__all__ = ['BACKENDS', 'INT8_PARTS', 'calibration_images', 'build_int8_part', 'install_int8', 'quantize_checkpoint',
           'evaluate_int8', 'int8_rows']


def calibration_images(runner, model: nn.Module, num: int = 32) -> list[torch.Tensor]:
    """The first ``num`` images of the training split, through the test pipeline and ``model.data_preprocessor``."""
    from mmengine.dataset import pseudo_collate
    if num < 1:
        raise ValueError(f'num calibration images must be >= 1, got {num}')
    train_ds = copy.deepcopy(runner.cfg.train_dataloader.dataset)
    while 'dataset' in train_ds and 'pipeline' not in train_ds:  # RepeatDataset & co.
        train_ds = train_ds['dataset']
    train_ds['pipeline'] = copy.deepcopy(runner.cfg.test_dataloader.dataset.pipeline)
    train_ds['test_mode'] = True
    loader_cfg = dict(batch_size=1, num_workers=0, dataset=train_ds,
                      sampler=dict(type='DefaultSampler', shuffle=False))
    loader = runner.build_dataloader(loader_cfg)
    images = []
    with torch.no_grad():
        for i, sample in enumerate(loader.dataset):
            if i == num:
                break
            images.append(model.data_preprocessor(pseudo_collate([sample]), False)['inputs'].float())
    return images


def build_int8_part(module: nn.Module, calibration: Sequence[torch.Tensor], backend: str, out: str,
                    keep_float=None) -> dict:
    """Quantise ``module`` (``image -> tuple of maps``) for ``backend``; writes ``out`` (.pte / .onnx).

    Returns ``dict(runner=callable(x) -> tuple, path=out, shape=(1, 3, H, W))``.
    """
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    keep_float = default_keep_float(backend, keep_float)
    ready = int8_ready(module)
    shape = tuple(calibration[0].shape) if calibration else None
    if backend == 'xnnpack':
        graph = quantize_pt2e(ready, calibration, keep_float)
        export_xnnpack(graph, calibration[0], out)
        return dict(runner=PteRunner(out, shape), path=out, shape=shape)
    from mmplugin.quantization.ort import OrtRunner, quantize_onnxruntime
    info = quantize_onnxruntime(ready, calibration, out, keep_float)
    return dict(runner=OrtRunner(out), path=out, shape=shape, float_nodes=info['float_nodes'])


class _Int8Features(nn.Module):
    """Backbone stand-in: ``(B, 3, H, W) -> tuple of maps`` from an int8 runner, image by image."""

    def __init__(self, runner: Callable):
        super().__init__()
        self.runner = runner
        self.images = 0  # images run so far (the metric path reports it)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [self.runner(x[i:i + 1]) for i in range(x.shape[0])]
        self.images += x.shape[0]
        return tuple(torch.cat([o[k] for o in outs]) for k in range(len(outs[0])))


class _PassThrough(nn.Module):
    """Neck stand-in when the int8 part already includes the neck."""

    def forward(self, feats):
        return feats


def install_int8(model: nn.Module, runner: Callable, part: str) -> None:
    """Replace ``model.backbone`` (and ``model.neck`` for ``part='backbone+neck'``) by the int8 ``runner``."""
    if part not in INT8_PARTS:
        raise ValueError(f'part must be one of {INT8_PARTS} for a task metric, got {part!r}')
    model.backbone = _Int8Features(runner)
    if part == 'backbone+neck':
        if not getattr(model, 'with_neck', False):
            raise ValueError(f"part 'backbone+neck': {type(model).__name__} has no neck")
        model.neck = _PassThrough()


def _load_runner(config: str, checkpoint: str, work_dir: str, cfg_options: dict | None):
    from mmengine.runner import Runner

    from mmplugin.apis import load_checkpoint_checked, load_config
    cfg = load_config(config, copy.deepcopy(cfg_options) if cfg_options else None)  # merging pops _delete_ markers
    cfg.work_dir = work_dir
    cfg.load_from = None
    cfg.model.get('backbone', {}).pop('init_cfg', None)  # weights come from the checkpoint
    vis = cfg.get('visualizer')
    if isinstance(vis, dict) and vis.get('name') == 'visualizer':
        vis.pop('name')
    runner = Runner.from_cfg(cfg)
    # the tools' one loading path: published layouts converted, then checked key by key (CheckpointError)
    load_checkpoint_checked(runner.model, checkpoint, model_name=config)
    return runner


def _check(backend: str, part: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    if part not in INT8_PARTS:
        raise ValueError(f'part must be one of {INT8_PARTS} for a task metric, got {part!r}')


def quantize_checkpoint(config: str, checkpoint: str, backend: str = 'xnnpack', part: str = 'backbone+neck',
                        keep_float=None, num_calib: int = 32, work_dir: str | None = None,
                        cfg_options: dict | None = None, runner=None) -> dict:
    """Quantise ``part`` of the model of ``config`` with ``checkpoint``, calibrated on ``num_calib`` training
    images (:func:`calibration_images`); the int8 file goes into ``work_dir``.

    Returns ``dict(path=, backend=, part=, keep_float=, num_calib=, shape=, runner=callable, runner_obj=mmengine
    Runner, cosine=lowest output cosine of the int8 part against fp32 on the first calibration image)``.
    """
    from mmplugin.export import ExportPart
    _check(backend, part)
    work_dir = work_dir or osp.join('work_dirs', 'int8', osp.splitext(osp.basename(config))[0])
    os.makedirs(work_dir, exist_ok=True)
    runner = runner or _load_runner(config, checkpoint, work_dir, cfg_options)
    model = runner.model.eval()
    calib = calibration_images(runner, model, num_calib)
    float_part = ExportPart(copy.deepcopy(model), part).eval()
    ext = '.pte' if backend == 'xnnpack' else '.onnx'
    built = build_int8_part(float_part, calib, backend, osp.join(work_dir, f'int8_{backend}{ext}'), keep_float)
    with torch.no_grad():
        cos = cosine(built['runner'](calib[0]), float_part(calib[0]))
    return dict(path=built['path'], backend=backend, part=part, keep_float=default_keep_float(backend, keep_float),
                num_calib=num_calib,
                shape=built['shape'], runner=built['runner'], runner_obj=runner, cosine=cos)


def evaluate_int8(config: str, checkpoint: str, backend: str = 'xnnpack', part: str = 'backbone+neck',
                  keep_float=None, num_calib: int = 32, work_dir: str | None = None,
                  cfg_options: dict | None = None, skip_fp32: bool = False) -> dict:
    """fp32 and int8 metrics of ``checkpoint`` on the config's test split (the same images, the same evaluator).

    fp32 first (the model as built), then :func:`quantize_checkpoint` and :func:`install_int8`, then the same test
    loop again. Returns :func:`quantize_checkpoint`'s dict (without the runners) plus ``fp32`` (None with
    ``skip_fp32``) and ``int8`` metric dicts, and ``int8_images``: how many test images went through the int8 part.
    """
    _check(backend, part)
    work_dir = work_dir or osp.join('work_dirs', 'int8', osp.splitext(osp.basename(config))[0])
    os.makedirs(work_dir, exist_ok=True)
    runner = _load_runner(config, checkpoint, work_dir, cfg_options)
    fp32 = None if skip_fp32 else dict(runner.test())
    info = quantize_checkpoint(config, checkpoint, backend, part, keep_float, num_calib, work_dir, runner=runner)
    install_int8(runner.model, info.pop('runner'), part)
    info.pop('runner_obj')
    int8 = dict(runner.test())
    return dict(info, fp32=fp32, int8=int8, int8_images=runner.model.backbone.images)


def _median_ms(fn: Callable, x: torch.Tensor) -> Callable[[], float]:
    def once() -> float:
        t = time.perf_counter()
        fn(x)
        return (time.perf_counter() - t) * 1e3
    return once


def int8_rows(model_part: nn.Module, example: torch.Tensor, calibration: Sequence[torch.Tensor] | None = None,
              backends: Sequence[str] = BACKENDS, keep_float=None, repeats: int = 10,
              warmup: int = 2, work_dir: str = 'work_dirs/int8_rows', metric: dict | None = None,
              name: str = '') -> list[dict]:
    """Rows for a speed table: eager fp32 and each int8 runtime on ``example`` ``(1, 3, H, W)``.

    Timings alternate (eager, backend 1, backend 2, ...) ``repeats`` times in this process after ``warmup`` runs
    each; medians in ms. ``calibration`` defaults to 8 random images (speed only; pass real images for numbers
    that mean something). ``metric`` maps a backend (or ``'fp32'``) to a task metric for its row.
    Each row: ``dict(model=name, runtime, ms, speedup (eager fp32 ms / ms), size_mb, cosine, metric)``.
    """
    for b in backends:
        if b not in BACKENDS:
            raise ValueError(f'backend must be one of {BACKENDS}, got {b!r}')
    if example.shape[0] != 1:
        raise ValueError(f'int8 programs are built for batch 1, got example shape {tuple(example.shape)}')
    os.makedirs(work_dir, exist_ok=True)
    model_part = model_part.eval()
    if calibration is None:
        g = torch.Generator().manual_seed(0)
        calibration = [torch.randn(example.shape, generator=g) for _ in range(8)]
    runners: dict[str, Callable] = {'eager fp32': model_part}
    sizes = {'eager fp32': sum(p.numel() * p.element_size() for p in model_part.parameters()) / 2**20}
    for b in backends:
        ext = '.pte' if b == 'xnnpack' else '.onnx'
        built = build_int8_part(model_part, calibration, b, osp.join(work_dir, f'{name or "part"}_{b}{ext}'),
                                keep_float)
        runners[f'{b} int8'] = built['runner']
        sizes[f'{b} int8'] = os.path.getsize(built['path']) / 2**20
    times: dict[str, list[float]] = {k: [] for k in runners}
    with torch.no_grad():
        ref = model_part(example)
        cos = {k: (1.0 if k == 'eager fp32' else cosine(r(example), ref)) for k, r in runners.items()}
        for _ in range(warmup):
            for r in runners.values():
                r(example)
        for _ in range(repeats):
            for k, r in runners.items():
                times[k].append(_median_ms(r, example)())
    ms = {k: statistics.median(v) for k, v in times.items()}
    metric = metric or {}
    return [dict(model=name, runtime=k, ms=round(ms[k], 2), speedup=round(ms['eager fp32'] / ms[k], 2),
                 size_mb=round(sizes[k], 2), cosine=round(cos[k], 5),
                 metric=metric.get('fp32' if k == 'eager fp32' else k.split()[0]),
                 threads=torch.get_num_threads()) for k in runners]


def table_rows(name: str, part: nn.Module, example: torch.Tensor, workdir: str) -> list:
    """Row builder for ``tools/edge_table.py --rows mmplugin.quantization.evaluate:table_rows``: the XNNPACK int8
    program (and the onnxruntime one where onnxruntime is installed) of ``part``, calibrated on 8 random images
    (latency does not depend on the weights' values); the rows report the output cosine against fp32 eager (task
    metrics: :func:`evaluate_int8`)."""
    from mmplugin.analysis.bench import Row
    from mmplugin.export import flatten_outputs
    from mmplugin.quantization.pt2e import cosine
    g = torch.Generator().manual_seed(0)
    calibration = [torch.randn(example.shape, generator=g) for _ in range(8)]
    with torch.inference_mode():
        ref = flatten_outputs(part(example))
    rows = []
    for backend in BACKENDS:
        ext = '.pte' if backend == 'xnnpack' else '.onnx'
        out = osp.join(workdir, f'{name}_{backend}_int8{ext}')
        try:
            built = build_int8_part(part, calibration, backend, out)
        except ImportError as err:  # that runtime is not installed
            print(f'note: {backend} int8 skipped: {err}')
            continue
        cos = cosine(flatten_outputs(built['runner'](example)), ref)
        rows.append(Row(f'{backend} int8', built['runner'], os.path.getsize(out), metric=f'cosine {cos:.4f}'))
    return rows

