"""ONNX export with dynamic batch / height / width, onnxruntime sessions and parity against eager PyTorch.

Exporter: ``torch.onnx.export(..., dynamo=True)`` (the default of torch >= 2.9): the model is captured with
``torch.export`` (sizes are symbolic, so padding, shifts, masks and window partitions are computed from the
input's shape inside the graph, see :mod:`mmplugin.models.backbones.swin.attention`) and translated by onnxscript.
Opset 18 by default: the lowest opset the dynamo exporter targets natively, and what onnxruntime >= 1.14 and
OpenVINO >= 2023.0 read. The TorchScript exporter (``dynamo=False``) is not supported: it records Python
integers computed from sizes as constants. What to export: :mod:`mmplugin.export.exportable`.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mmplugin.export.exportable import flatten_outputs
from mmplugin.utils.numerics import max_rel_error

__all__ = ['DEFAULT_OPSET', 'example_input', 'export_onnx', 'onnx_session', 'onnx_parity']

DEFAULT_OPSET = 18


def example_input(batch: int = 2, size: tuple[int, int] = (224, 256), channels: int = 3) -> torch.Tensor:
    """Example input for export. No dimension may be 1 (torch.export specialises size-1 dims to the constant 1),
    and ``size`` should not be a multiple of everything (so no divisibility is assumed)."""
    if batch < 2 or min(size) < 2:
        raise ValueError(f'example batch and sizes must be >= 2 (a size-1 dim is specialised), got batch={batch}, '
                         f'size={tuple(size)}')
    return torch.randn(batch, channels, *size)


def export_onnx(module: nn.Module, out: str, example: torch.Tensor | None = None, opset: int = DEFAULT_OPSET,
                output_prefix: str = 'out') -> list[str]:
    """Export ``module`` (one image tensor in, a tuple of tensors out) with dynamic batch, height and width.

    Returns the output names. The input is named ``input``; outputs ``{output_prefix}{i}``.
    Raises RuntimeError naming the exporter's complaint when the graph cannot be captured with dynamic sizes.
    """
    import onnx  # noqa: F401  (a clear ImportError before the long capture)
    import onnxscript  # noqa: F401
    from torch.export import Dim

    module = module.eval()
    example = example_input() if example is None else example
    with torch.no_grad():
        n_out = len(flatten_outputs(module(example)))
    names = [f'{output_prefix}{i}' for i in range(n_out)]
    dyn = {0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC}
    try:
        prog = torch.onnx.export(module, (example, ), dynamo=True, dynamic_shapes=(dyn, ), opset_version=opset,
                                 input_names=['input'], output_names=names, optimize=True, verbose=False)
    except Exception as err:  # noqa: BLE001  (re-raised with the part of the message that matters)
        raise RuntimeError(f'ONNX export with dynamic batch/height/width failed: {str(err)[:4000]}') from err
    prog.save(out)
    return names


def onnx_session(path: str):
    """An onnxruntime CPU session (all graph optimisations, deterministic input/output names)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])


def onnx_parity(module: nn.Module, path: str, shapes: Sequence[tuple[int, int, int, int]], seed: int = 0,
                session=None) -> dict[tuple[int, ...], float]:
    """Max relative error of onnxruntime against eager ``module`` for random inputs of each ``(B, C, H, W)``."""
    sess = session or onnx_session(path)
    return parity_against_eager(
        module, lambda x: [torch.from_numpy(o) for o in sess.run(None, {'input': x.numpy()})], shapes, seed)


def parity_against_eager(module: nn.Module, runner, shapes: Sequence[tuple[int, ...]],
                         seed: int = 0) -> dict[tuple[int, ...], float]:
    """Max relative error of ``runner(x) -> outputs`` (an exported program of any runtime) against eager
    ``module`` for seeded random inputs ``x`` of each shape ``(B, C, H, W)``."""
    g = torch.Generator().manual_seed(seed)
    errs = {}
    module = module.eval()
    for shape in shapes:
        x = torch.randn(*shape, generator=g)
        with torch.no_grad():
            ref = flatten_outputs(module(x))
        errs[tuple(shape)] = max_rel_error(runner(x), ref)
    return errs
