"""Core ML ``mlprogram`` (``.mlpackage``) through ``torch.export`` and coremltools, with the checks Linux can make.

coremltools 9.0 converts ``torch.export`` programs of torch 2.13 (it warns that it tested torch <= 2.7; the
TorchScript path fails on SwiftFormer: ``aten::Int`` from a reshape of traced sizes). The model must be in deploy
form (:func:`mmplugin.export.backends.prepare`); eval-mode on-the-fly folds fail in the converter (``matmul`` on
computed weights). Fixed input shape (the example's). ``predict`` needs macOS (Core ML framework); on Linux the
program is checked instead: every op is a core MIL op of the deployment target (no custom or unconverted ops),
input and output shapes are the eager ones. On a Mac::

    python -c "import coremltools as ct, numpy as np; m = ct.models.MLModel('model.mlpackage'); \
print({k: v.shape for k, v in m.predict({'input': np.random.rand(1, 3, 512, 512).astype(np.float32)}).items()})"
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import nn

INSTALL = 'pip install "mmplugin[edge]" (coremltools)'
PRECISIONS = ('fp16', 'fp32')


def missing() -> str | None:
    """None when coremltools imports, else the reason."""
    try:
        import coremltools  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f'coremltools is not usable: {type(err).__name__}: {err}; {INSTALL}'
    return None


def program_ops(mlmodel) -> Counter:
    """``{MIL op type: count}`` of the converted program's ``main`` function (constants excluded)."""
    ops = Counter(op.op_type for op in mlmodel._mil_program.functions['main'].operations)
    ops.pop('const', None)
    return ops


def unsupported_ops(ops) -> list[str]:
    """Op types of ``ops`` that are not core MIL ops (custom layers or anything Core ML would not run)."""
    from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry
    return sorted(t for t in ops if t not in SSAOpRegistry.core_ops)


def check_options(precision: str = 'fp16', target: str = 'iOS17') -> None:
    """ValueError for a precision or deployment target :func:`export` does not take."""
    import coremltools as ct
    if precision not in PRECISIONS:
        raise ValueError(f'Core ML precision must be one of {PRECISIONS}, got {precision!r}')
    if not hasattr(ct.target, target):
        raise ValueError(f'unknown Core ML deployment target {target!r} (e.g. iOS16, iOS17, macOS14)')


def export(module: nn.Module, out: str, example: torch.Tensor, precision: str = 'fp16',
           target: str = 'iOS17') -> dict:
    """Convert ``module`` (deploy form, eval) to an ``mlprogram`` and save it at ``out`` (.mlpackage).

    ``precision``: compute precision of the program, ``'fp16'`` (what the Neural Engine runs) or ``'fp32'``.
    ``target``: minimum deployment target (a ``coremltools.target`` name). Input ``input``, outputs ``out0 ...``.
    Returns ``ops`` (``{MIL op type: count}``), ``inputs`` / ``outputs`` (``{name: shape}``).
    """
    import coremltools as ct

    check_options(precision, target)
    from mmplugin.export import flatten_outputs
    n_out = len(flatten_outputs(module(example)))
    ep = torch.export.export(module, (example, )).run_decompositions({})
    mlmodel = ct.convert(
        ep, convert_to='mlprogram', minimum_deployment_target=getattr(ct.target, target),
        compute_precision=ct.precision.FLOAT16 if precision == 'fp16' else ct.precision.FLOAT32,
        inputs=[ct.TensorType(name='input', shape=tuple(example.shape))],
        outputs=[ct.TensorType(name=f'out{i}') for i in range(n_out)])
    ops = program_ops(mlmodel)
    bad = unsupported_ops(ops)
    if bad:
        raise RuntimeError(f'the program holds ops Core ML does not run: {bad}')
    mlmodel.save(out)
    return dict(ops=dict(ops), precision=precision, target=target, **io_shapes(mlmodel))


def io_shapes(mlmodel) -> dict:
    """``{'inputs': {name: shape}, 'outputs': {name: shape}}`` from the model's description."""
    desc = mlmodel.get_spec().description
    return dict(inputs={i.name: tuple(i.type.multiArrayType.shape) for i in desc.input},
                outputs={o.name: tuple(o.type.multiArrayType.shape) for o in desc.output})


def inspect(path: str) -> dict:
    """Ops and shapes of a saved ``.mlpackage`` (loads no Core ML runtime, works on Linux)."""
    import coremltools as ct
    mlmodel = ct.models.MLModel(path, skip_model_load=True)
    return dict(spec_version=mlmodel.get_spec().specificationVersion, **io_shapes(mlmodel))


def load(path: str, threads: int | None = None):
    """``runner(image) -> list of tensors`` through Core ML's ``predict`` (macOS only)."""
    import platform

    from mmplugin.export.backends import BackendUnavailable
    if platform.system() != 'Darwin':
        raise BackendUnavailable(f'Core ML prediction needs macOS (this is {platform.system()}); the .mlpackage was '
                                 'converted and checked here, run it on a Mac (docs/deploy_edge.md)')
    if threads:
        raise ValueError('Core ML chooses its own threads; do not pass threads for coreml')
    import coremltools as ct
    mlmodel = ct.models.MLModel(path)
    names = [o.name for o in mlmodel.get_spec().description.output]

    def run(x: torch.Tensor) -> list:
        got = mlmodel.predict({'input': x.numpy()})
        return [torch.from_numpy(got[n]) for n in names]

    return run
