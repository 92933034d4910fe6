"""Mixed-precision training on any device: ``type='mmplugin.AmpOptimWrapper'``.

mmengine's ``AmpOptimWrapper`` refuses to start without a GPU / NPU / MLU / MUSA and its autocast takes only bf16
on the CPU, so an fp16 (or any) AMP config cannot be tried, trained or debugged on a CPU machine. This wrapper is
mmengine's (same arguments, same state dict with ``loss_scaler``, so checkpoints move between the two), with the
device read from the parameters it optimises:

* ``torch.autocast(device, dtype)`` around the forward; ``dtype`` None: fp16 on CUDA (mmengine's default), bf16
  elsewhere (the CPU autocast default).
* mmcv's CPU NMS / RoIAlign, which have no half-precision kernels, run in fp32 under it
  (:mod:`.mmcv_ops`).
* fp16 on the CPU: oneDNN has no fp16 kernel for a convolution's weight gradient (its reference loop takes 3.4 s
  where fp32 takes 0.04 s, a 128-channel 3x3 convolution on 4x48x48, Xeon family 6 model 167), so the backward
  pass computes convolution gradients from fp32 copies of the fp16 operands (exact: fp16 values are fp32 values)
  and rounds them back to fp16 (:class:`Fp32ConvolutionBackward`).
* ``torch.amp.GradScaler(device)`` for the loss scaling (dynamic by default): fp16 gradients underflow without it.
  For bf16, whose range is fp32's, the scaler is off unless ``loss_scale`` is given explicitly.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from mmengine.optim import AmpOptimWrapper as _MMEngineAmpOptimWrapper
from mmengine.optim import OptimWrapper
from torch.utils._python_dispatch import TorchDispatchMode

from mmplugin.engine.mmcv_ops import install_cpu_reduced_precision_ops
from mmplugin.registry import OPTIM_WRAPPERS
from mmplugin.utils.errors import ConfigTypeError, ConfigValueError

__all__ = ['AmpOptimWrapper', 'Fp32ConvolutionBackward', 'default_amp_dtype']


def default_amp_dtype(device_type: str) -> torch.dtype:
    """What AMP computes in when the config names no dtype: fp16 on CUDA (mmengine's default), bf16 elsewhere."""
    return torch.float16 if device_type == 'cuda' else torch.bfloat16


class Fp32ConvolutionBackward(TorchDispatchMode):
    """While active: ``aten.convolution_backward`` of fp16 CPU tensors runs on fp32 copies and returns fp16
    gradients (the same values as an fp16 kernel accumulating in fp32); every other call is passed through."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten.convolution_backward.default and args[0].device.type == 'cpu'
                and args[0].dtype == torch.float16):
            grads = func(*(a.float() for a in args[:3]), *args[3:], **kwargs)
            return tuple(None if g is None else g.to(torch.float16) for g in grads)
        return func(*args, **kwargs)


@OPTIM_WRAPPERS.register_module()
class AmpOptimWrapper(_MMEngineAmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` on every device, the CPU included.

    Args:
        loss_scale (str | float | dict): ``'dynamic'`` (default), a static initial scale, or ``GradScaler`` keyword
            arguments. With bf16 and the default, no scaling (bf16 has fp32's exponent range).
        dtype (str | torch.dtype | None): ``'float16'`` / ``'bfloat16'`` (or the dtype); None: see
            :func:`default_amp_dtype`.
        use_fsdp (bool): ``ShardedGradScaler`` (FSDP). **kwargs: :class:`mmengine.optim.OptimWrapper` arguments.
    """

    def __init__(self, loss_scale='dynamic', dtype=None, use_fsdp: bool = False, **kwargs):
        OptimWrapper.__init__(self, **kwargs)  # mmengine's __init__ asserts an accelerator
        if isinstance(dtype, str):
            if dtype not in ('float16', 'bfloat16'):
                raise ConfigValueError(f"mmplugin.AmpOptimWrapper: dtype must be 'float16' or 'bfloat16' (or None), "
                                 f'got {dtype!r}')
            dtype = getattr(torch, dtype)
        if dtype not in (None, torch.float16, torch.bfloat16):
            raise ConfigValueError(f'mmplugin.AmpOptimWrapper: dtype must be torch.float16 or torch.bfloat16, '
                                   f'got {dtype!r}')
        params = [p for g in self.optimizer.param_groups for p in g['params']]
        self.device_type = params[0].device.type if params else 'cpu'
        if self.device_type == 'cpu':
            install_cpu_reduced_precision_ops()  # mmcv's CPU NMS / RoIAlign in fp32 under autocast
        self.cast_dtype = dtype or default_amp_dtype(self.device_type)
        self._scale_update_param = None
        enabled = self.cast_dtype == torch.float16 or loss_scale != 'dynamic'
        if use_fsdp:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
            make = lambda **kw: ShardedGradScaler(self.device_type, enabled=enabled, **kw)  # noqa: E731
        else:
            make = lambda **kw: torch.amp.GradScaler(self.device_type, enabled=enabled, **kw)  # noqa: E731
        if loss_scale == 'dynamic':
            self.loss_scaler = make()
        elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
            self._scale_update_param = float(loss_scale)
            self.loss_scaler = make(init_scale=float(loss_scale))
        elif isinstance(loss_scale, dict):
            self.loss_scaler = make(**loss_scale)
        else:
            raise ConfigTypeError(f"mmplugin.AmpOptimWrapper: loss_scale must be 'dynamic', a number or a dict of "
                            f'GradScaler arguments, got {loss_scale!r}')

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss_scaler.scale(loss).backward()`` (fp16 CPU convolution gradients via fp32, see the module)."""
        if self.device_type == 'cpu' and self.cast_dtype == torch.float16:
            with Fp32ConvolutionBackward():
                super().backward(loss, **kwargs)
        else:
            super().backward(loss, **kwargs)

    @contextmanager
    def optim_context(self, model):
        """Gradient-accumulation context of ``OptimWrapper`` plus autocast on the parameters' device."""
        with OptimWrapper.optim_context(self, model), torch.autocast(self.device_type, dtype=self.cast_dtype):
            yield
