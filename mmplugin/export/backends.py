"""One interface to the export targets: ONNX (onnxruntime) and the mobile runtimes ExecuTorch (XNNPACK), LiteRT
and Core ML.

``export(module, backend, out, example)`` writes ``out`` and returns what was checked; ``load(backend, out)``
gives a ``runner(image) -> list of tensors`` where the runtime executes on this machine (ONNX, ExecuTorch,
LiteRT; Core ML predicts on macOS only); ``parity(module, runner, shapes)`` compares it with eager.

``module`` is an :class:`mmplugin.export.ExportPart` or a backbone (one image ``(B, C, H, W)`` in, a tuple of
tensors out). The mobile runtimes get :func:`prepare` 's copy of it: deploy form (BatchNorm and layer scales folded
into constant weights, ``switch_to_deploy()``), contiguous (NCHW) memory. Their graphs have **fixed shapes**: the
example's ``(B, C, H, W)`` is the only input shape the file accepts (ONNX keeps dynamic batch / height / width).
The runtimes are optional (``pip install 'mmplugin[edge]'`` for ExecuTorch and Core ML, ``'mmplugin[litert]'``
for LiteRT): a missing one raises :class:`BackendUnavailable` naming the install command.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import os
from collections.abc import Callable, Sequence

import torch
from torch import nn

BACKENDS = ('onnx', 'executorch', 'litert', 'coreml')
MOBILE_BACKENDS = BACKENDS[1:]
SUFFIX = {'onnx': '.onnx', 'executorch': '.pte', 'litert': '.tflite', 'coreml': '.mlpackage'}
MIN_SIZE = 32  # the smallest height / width: the stride-32 stage needs at least one position
Runner = Callable[[torch.Tensor], list]


class BackendUnavailable(ImportError):
    """The runtime or converter of a backend is not installed (the message says which extra installs it)."""


class BackendExportError(RuntimeError):
    """A backend cannot convert this model (the message names the backend, the model, the size and the cause)."""


def _backend_module(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    if backend == 'onnx':
        return None
    return importlib.import_module(f'{__package__}.{backend}')


def available(backend: str) -> str | None:
    """None when ``backend`` can export here, else the reason (what is missing and how to install it)."""
    mod = _backend_module(backend)
    if mod is None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as err:
            return f'onnx: {err} (pip install "mmplugin[tests]")'
        return None
    return mod.missing()


def require(backend: str) -> None:
    """Raise :class:`BackendUnavailable` when ``backend`` is not installed."""
    reason = available(backend)
    if reason:
        raise BackendUnavailable(reason)


def _deploy_(module: nn.Module) -> None:
    """Call ``switch_to_deploy()`` on the outermost submodules that have one (a backbone's folds its blocks')."""
    for child in module.children():
        if callable(getattr(child, 'switch_to_deploy', None)):
            child.switch_to_deploy()
        else:
            _deploy_(child)


@torch.no_grad()
def prepare(module: nn.Module) -> nn.Module:
    """An eval-mode copy of ``module`` in deploy form with contiguous NCHW memory; ``module`` is left unchanged.

    Deploy form: BatchNorm and layer scales folded into the convs / linears (``switch_to_deploy()``, exact algebra,
    ~1e-7 relative), so that every weight is a constant parameter (delegates such as XNNPACK take only static
    weights; the on-the-fly folds of eval mode compute weights inside the graph). Backbones computing in
    ``channels_last`` switch to NCHW: layout conversions become ``_clone_dim_order`` ops that XNNPACK and the Core ML
    partitioner reject.
    """
    from mmplugin.models.layers.prepack import release_prepacked
    m = copy.deepcopy(module).eval()
    if callable(getattr(m, 'switch_to_deploy', None)):
        m.switch_to_deploy()
    else:
        _deploy_(m)
    release_prepacked(m)  # graph capture never reads packed weights: no frozen marks left on the copy
    for sub in m.modules():
        if getattr(sub, 'channels_last', None) is True:
            sub.channels_last = False
    return m.to(memory_format=torch.contiguous_format)


def model_name(module: nn.Module) -> str:
    bb = getattr(module, 'backbone', module)
    arch = getattr(bb, 'arch_name', None)
    return type(bb).__name__ + (f"('{arch}')" if arch else '') + (
        f" {module.part}" if getattr(module, 'part', None) else '')


def check_example(example: torch.Tensor) -> None:
    """A clear error for an example no mobile export takes: not ``(B, C, H, W)`` float32, or H / W < 32."""
    if not isinstance(example, torch.Tensor) or example.ndim != 4 or example.dtype != torch.float32:
        raise ValueError('the example must be a float32 image tensor (B, C, H, W), got '
                         f'{getattr(example, "dtype", type(example))} {tuple(getattr(example, "shape", ()))}')
    if min(example.shape[-2:]) < MIN_SIZE:
        raise ValueError(f'height and width must be >= {MIN_SIZE} (one position at stride 32), got '
                         f'{tuple(example.shape[-2:])}')


def export(module: nn.Module, backend: str, out: str, example: torch.Tensor, **options) -> dict:
    """Export ``module`` for ``backend`` to ``out``; returns a summary (``path``, ``bytes``, backend details).

    ``onnx``: dynamic batch / height / width (:func:`mmplugin.export.export_onnx`; ``module`` as given, eval
    mode). Mobile backends: :func:`prepare` 's copy, traced with ``torch.export`` at the example's fixed shape.
    Options: ``opset`` (onnx); ``precision='fp32' | 'fp16'`` and ``target`` (coreml, e.g. ``'iOS17'``).
    Raises :class:`BackendUnavailable` (not installed), ValueError (bad example or option) or
    :class:`BackendExportError` (the converter rejects the model).
    """
    mod = _backend_module(backend)
    if mod is not None:
        check_example(example)
        try:
            inspect.signature(mod.export).bind(module, out, example, **options)
        except TypeError:
            raise ValueError(f'{backend} export takes the options {list(inspect.signature(mod.export).parameters)[3:]}'
                             f', got {sorted(options)}') from None
    require(backend)
    if mod is None:
        from mmplugin.export import export_onnx
        unknown = set(options) - {'opset'}
        if unknown:
            raise ValueError(f'onnx export takes the option opset only, got {sorted(unknown)}')
        names = export_onnx(module, out, example, **options)
        return dict(backend=backend, path=out, bytes=file_size(out), outputs=names, shapes='dynamic')
    if hasattr(mod, 'check_options'):
        mod.check_options(**options)
    deployed = prepare(module)
    try:
        with torch.no_grad():
            info = mod.export(deployed, out, example, **options)
    except BackendUnavailable:
        raise
    except Exception as err:  # noqa: BLE001  (the converter's message, with what was being converted)
        raise BackendExportError(f'{backend} cannot convert {model_name(module)} at input '
                                 f'{tuple(example.shape)}: {type(err).__name__}: {str(err)[:2000]}') from err
    return dict(backend=backend, path=out, bytes=file_size(out), shapes=f'fixed {tuple(example.shape)}', **info)


def load(backend: str, path: str, threads: int | None = None) -> Runner:
    """``runner(image) -> list of output tensors`` executing ``path`` in ``backend``'s runtime on this machine.

    ``threads``: the runtime's thread count (default: its own choice). Core ML predicts on macOS only: on other
    systems this raises :class:`BackendUnavailable`.
    """
    mod = _backend_module(backend)
    if mod is None:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])
        return lambda x: [torch.from_numpy(o) for o in sess.run(None, {'input': x.numpy()})]
    return mod.load(path, threads)


def parity(module: nn.Module, runner: Runner, shapes: Sequence[tuple[int, int, int, int]],
           seed: int = 0) -> dict[tuple[int, ...], float]:
    """Max relative error (:func:`mmplugin.utils.numerics.max_rel_error`) of ``runner`` against eager ``module``
    (the original, not the deploy copy) for seeded random inputs of each ``(B, C, H, W)``."""
    from mmplugin.export.onnx import parity_against_eager
    return parity_against_eager(module, runner, shapes, seed)


def file_size(path: str) -> int:
    """Bytes of a file, or of every file under a directory (a ``.mlpackage`` is one)."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def export_and_check(module: nn.Module, backend: str, out: str, example: torch.Tensor,
                     shapes: Sequence[tuple[int, int, int, int]] | None = None,
                     threads: int | None = None, **options) -> tuple[dict, dict[tuple[int, ...], float] | None]:
    """:func:`export`, then :func:`parity` at ``shapes`` where the runtime runs here; returns ``(summary, errors)``.

    ``shapes`` default: the example's shape. Mobile backends take only the example's shape (ValueError for any
    other). ``errors`` is None for Core ML off macOS (converted and checked, not run: see :mod:`.coreml`).
    """
    if shapes is None:
        shapes = [tuple(example.shape)]
    if backend != 'onnx':
        other = [tuple(s) for s in shapes if tuple(s) != tuple(example.shape)]
        if other:
            raise ValueError(f'{backend} files have the fixed input shape {tuple(example.shape)} (the example); '
                             f'cannot check at {other}: export once per size')
    info = export(module, backend, out, example, **options)
    try:
        runner = load(backend, out, threads)
    except BackendUnavailable:
        if backend != 'coreml':
            raise
        return info, None
    return info, parity(module, runner, shapes)


def export_main(part: nn.Module, backend: str, out: str, example_bhw: tuple[int, int, int],
                verify: Sequence[tuple[int, int, int]], tol: float = 1e-4, **options) -> int:
    """``tools/export.py --backend``: export at the fixed ``(B, H, W)``, print the summary and the parity at
    ``verify`` (``[]``: none); returns the exit code (0 ok, 1 parity above ``tol``, 2 cannot export here)."""
    import sys
    import time
    c = getattr(getattr(part, 'backbone', part), 'in_channels', 3)
    b, h, w = example_bhw
    example = torch.randn(b, c, h, w, generator=torch.Generator().manual_seed(0))
    t = time.perf_counter()
    try:
        if not verify:
            info, errs = export(part, backend, out, example, **options), None
        else:
            info, errs = export_and_check(part, backend, out, example, [(vb, c, vh, vw) for vb, vh, vw in verify],
                                          **options)
    except (BackendUnavailable, BackendExportError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    details = {k: v for k, v in info.items() if k not in ('backend', 'path')}
    print(f'exported {model_name(part)} to {out} ({backend}) in {time.perf_counter() - t:.0f} s: {details}')
    if errs is None:
        if verify and backend == 'coreml':
            print('Core ML: converted and checked (ops, shapes); prediction needs macOS (docs/deploy_edge.md)')
        return 0
    print(f'{backend} vs eager (max relative error):')
    for shape, err in errs.items():
        print(f'  {"x".join(map(str, shape)):>16s}  {err:.2e}  {"ok" if err <= tol else "FAIL"}')
    return 0 if all(e <= tol for e in errs.values()) else 1
