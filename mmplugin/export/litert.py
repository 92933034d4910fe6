"""LiteRT (TensorFlow Lite) ``.tflite`` through litert-torch, and a runner through ai-edge-litert's interpreter.

litert-torch 0.10.0 + ai-edge-litert 2.3.0 on torch 2.13 (Python 3.11). They pull in jax, transformers and
xdsl (which wants typing-extensions < 4.13, older than executorch's environment): install them in their own
environment (``pip install "mmplugin[litert]"``, docs/deploy_edge.md). Fixed input shape (the example's); the
interpreter applies its XNNPACK delegate by default. NCHW in and out, as in PyTorch (the converter inserts the
layout transposes itself).
"""
from __future__ import annotations

import torch
from torch import nn

INSTALL = ('pip install "mmplugin[litert]" (litert-torch, ai-edge-litert; a separate environment: '
           'see docs/deploy_edge.md)')


def missing() -> str | None:
    """None when litert-torch and ai-edge-litert import, else the reason."""
    try:
        import litert_torch  # noqa: F401
        from ai_edge_litert.interpreter import Interpreter  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f'LiteRT is not usable: {type(err).__name__}: {err}; {INSTALL}'
    return None


def export(module: nn.Module, out: str, example: torch.Tensor) -> dict:
    """Convert ``module`` (deploy form, eval) with litert-torch and write ``out`` (.tflite)."""
    import litert_torch

    litert_torch.convert(module, (example, )).export(out)
    return {}


def _output_index(name: str) -> int:
    return int(name.rsplit('_', 1)[-1])


def load(path: str, threads: int | None = None):
    """``runner(image) -> list of tensors`` through the interpreter's default signature (XNNPACK delegate).

    ``threads``: the interpreter's thread count (default: LiteRT's choice).
    """
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path, num_threads=threads) if threads else Interpreter(model_path=path)
    runner = interp.get_signature_runner()
    (name, ) = runner.get_input_details()  # litert-torch names the one input args_0, outputs output_0 ...

    def run(x: torch.Tensor) -> list:
        got = runner(**{name: x.contiguous().numpy()})
        return [torch.from_numpy(got[k].copy()) for k in sorted(got, key=_output_index)]

    return run
