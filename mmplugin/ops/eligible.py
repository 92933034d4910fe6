"""Where the plugin's raw-pointer C kernels may run: eager calls on real CPU tensors.

The kernels read and write tensor memory through ``data_ptr()``, which graphs and tensor subclasses do not have: a
trace, ``torch.jit.script``, an ONNX or ``torch.export`` export and ``torch.compile`` record PyTorch's own ops
instead (the exporters and inductor know those), and fake, meta or dual (forward-mode AD) tensors have no memory
the kernel could compute with.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ['plain_cpu', 'eager_context']


def plain_cpu(t: torch.Tensor | None) -> bool:
    """A real CPU tensor whose memory a kernel may read (or None): not a fake / meta / subclass tensor, no dual
    tangent."""
    return t is None or (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == 'cpu'
                         and fwAD.unpack_dual(t).tangent is None)


def eager_context() -> bool:
    """Not tracing, scripting, exporting or compiling, and no Python dispatch mode (fake tensors, ``FlopCounterMode``)
    active: an op runs here and now on real memory."""
    # the graph checks first: under torch.compile the dispatch-mode query is not traceable
    return (not (torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()
                 or torch.compiler.is_compiling() or torch.compiler.is_exporting())
            and _get_current_dispatch_mode() is None)
