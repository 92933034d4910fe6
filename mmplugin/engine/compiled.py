"""Training with the backbone compiled (``tools/train.py --compile-backbone``).

Where it pays, measured with ``mmplugin.analysis.speed.training_rows(..., compiled=True)`` (batch 2 at 512x768,
forward + backward + AdamW, AMD EPYC family 25 model 17, 2 threads): SwiftFormer-L1 1.05x eager in fp32 and 1.18x in
bf16 autocast, after 79-89 s of compiling; Swin-T 0.95x / 0.86x (slower, so leave it off for Swin). docs/benchmarks.md
has the rows.

Only the backbone is compiled (the heads' mmcv ops, NMS and sampling would break the graph into pieces), in place
with ``nn.Module.compile``: the module, its parameters and its state dict keys stay what they were, so checkpoints,
``init_cfg`` and ``--resume`` are unaffected. Shapes are static: each input size compiles its own graph on its first
iteration, so the option suits fixed-size training (segmentation crops, a fixed ``size`` in the data preprocessor).
Dynamic shapes are not used: inductor (torch 2.13) fails to build SwiftFormer's training graphs with symbolic sizes.
"""
from __future__ import annotations

from torch import nn

__all__ = ['compile_backbone']


def compile_backbone(model: nn.Module) -> nn.Module:
    """Compile the backbone of a detector / segmentor (or of the model a wrapper such as DDP holds) in place for
    training: inductor, static shapes. Returns the backbone.

    Raises:
        ValueError: the model has no ``backbone`` module.
    """
    from mmengine.model import is_model_wrapper
    inner = model.module if is_model_wrapper(model) else model
    backbone = getattr(inner, 'backbone', None)
    if not isinstance(backbone, nn.Module):
        raise ValueError(f'--compile-backbone: {type(inner).__name__} has no backbone module to compile')
    backbone.compile(backend='inductor', dynamic=False)
    return backbone
