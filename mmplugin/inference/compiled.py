"""``--compile static``: backbone + neck compiled by inductor with frozen weights, one graph per input size.

Why: on a CPU the eager backbones spend a third or more of their time outside the GEMMs (norms, activations, adds,
window gathers, softmax; docs/benchmarks.md). Inductor fuses those, and with frozen weights it folds constants and
prepacks the linears' weights for oneDNN, which it can only do for a fixed input shape and weights that no longer
change. So each padded input size gets its own graph: the first image of a size pays the compile (about a minute
for Swin-T on two cores), later images of that size run the compiled graph. Fixed-size inputs are where this pays:
mmseg's sliding-window test, fixed-resolution serving, batch padding to one size. With sizes that keep changing,
``--compile`` (dynamic shapes, one graph) or the eager path is the better choice.

How: :class:`StaticCompiledFeatures` replaces ``model.extract_feat`` (mmdet detectors and mmseg segmentors both send
images through it: ``(B, 3, H, W)`` -> the neck's maps) by the compiled function. Sizes beyond ``max_sizes`` run
eager (counted, never silently different: the same function). Weights are read once per compile, so the model is
inference-only from then on: gradient mode is refused with a clear error rather than returning frozen, stale
results. Under ``--fast`` the autocast context is part of the compiled graph (dynamo guards on it).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from mmplugin.utils.errors import ConfigValueError

__all__ = ['StaticCompiledFeatures', 'enable_static_compile', 'freezing']


def freezing():
    """Inductor's weight freezing for the compiles started inside this context (constant folding, oneDNN weight
    prepacking). Set as a config patch around the call that compiles: passed as ``torch.compile(options=...)`` it
    does not take effect (torch 2.13: SwiftFormer-L1 at 800x1216 then runs at unfrozen speed, 620 against 530 ms)."""
    import torch._inductor.config as inductor_config
    return inductor_config.patch(freezing=True)


class StaticCompiledFeatures:
    """A drop-in ``extract_feat`` compiled per input shape: ``(B, C, H, W)`` images -> the model's feature maps.

    Args:
        model (nn.Module): an mmdet detector or mmseg segmentor with its weights loaded (each compile freezes them).
        max_sizes (int): input shapes (batch, channels, height, width, dtype) that get a graph; later new shapes
            run eager. Raises dynamo's recompile limit of this function to at least this many.
        backend (str): the ``torch.compile`` backend (``'inductor'``; tests pass a recorder).

    Attributes: ``stats``: compiles (new shapes seen) and their seconds, compiled calls, eager calls beyond
    ``max_sizes`` (printed by the tools at the end).
    """

    def __init__(self, model: nn.Module, max_sizes: int = 8, backend: str = 'inductor'):
        if max_sizes < 1:
            raise ConfigValueError(f'max_sizes must be >= 1, got {max_sizes}')
        if not callable(getattr(model, 'extract_feat', None)):
            raise ConfigValueError(f'{type(model).__name__} has no extract_feat(); --compile static serves mmdet '
                                   'detectors and mmseg segmentors')
        import torch._dynamo.config as dynamo_config
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, max_sizes)
        self.max_sizes = max_sizes
        self._eager = model.extract_feat
        self._compiled = torch.compile(self._eager, backend=backend, dynamic=False)
        self._shapes: set = set()
        self.stats = dict(compiles=0, compile_s=0.0, calls=0, eager_calls=0)

    def __call__(self, inputs: torch.Tensor, *args, **kwargs):
        if torch.is_grad_enabled():
            raise RuntimeError('--compile static freezes the weights into the compiled graphs: inference only. Run it '
                               'under torch.no_grad() (the test and inference tools do), or use --compile for training')
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(f'--compile static: extract_feat takes an image tensor, got {type(inputs).__name__}')
        key = (tuple(inputs.shape), inputs.dtype, inputs.device.type, torch.is_autocast_enabled(inputs.device.type))
        self.stats['calls'] += 1
        if key in self._shapes:
            return self._compiled(inputs, *args, **kwargs)
        if len(self._shapes) >= self.max_sizes:
            self.stats['eager_calls'] += 1
            return self._eager(inputs, *args, **kwargs)
        t = time.perf_counter()
        with freezing():  # the compile happens in this call; its graphs keep the frozen weights
            out = self._compiled(inputs, *args, **kwargs)
        self._shapes.add(key)
        self.stats['compiles'] += 1
        self.stats['compile_s'] += time.perf_counter() - t
        return out

    def message(self) -> str:
        """One line for the tools: compiled shapes, their compile time, calls and eager calls beyond the limit."""
        s = self.stats
        beyond = f', {s["eager_calls"]} eager (beyond {self.max_sizes} sizes)' if s['eager_calls'] else ''
        return (f'--compile static: backbone + neck compiled per input size with frozen weights; {s["compiles"]} '
                f'size(s) compiled in {s["compile_s"]:.0f} s, {s["calls"]} call(s){beyond}')

    def close(self) -> None:
        """Nothing to release (the graphs live in dynamo's cache); for the tools' common clean-up."""


def enable_static_compile(model: nn.Module, max_sizes: int = 8, backend: str = 'inductor') -> StaticCompiledFeatures:
    """Replace ``model.extract_feat`` by :class:`StaticCompiledFeatures`; ``state_dict`` keys are unchanged."""
    feats = StaticCompiledFeatures(model, max_sizes, backend)
    model.extract_feat = feats
    return feats
