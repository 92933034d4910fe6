"""Distributed training on CPUs (gloo) and across nodes.

mmengine 0.10.7 assumes a GPU per process (``torch.cuda.set_device``, ``device_ids=[LOCAL_RANK]``, FSDP's
``device_id=LOCAL_RANK``); these helpers let the same Runner / FlexibleRunner run multi-process on CPU-only machines,
and give every distributed run a bounded collective timeout (docs/distributed.md).
"""
from __future__ import annotations

import datetime
import numbers
import os

import torch
from mmengine._strategy import FSDPStrategy
from mmengine.model import MMDistributedDataParallel, MMFullyShardedDataParallel

from mmplugin.registry import MODEL_WRAPPERS, STRATEGIES

#: Seconds a collective (all-reduce, broadcast, barrier) waits for the other ranks before it raises and the process
#: exits; ``env_cfg.dist_cfg.timeout`` in a config overrides it. Long enough for work that only rank 0 does between
#: two collectives (saving a Swin-L checkpoint, COCO evaluation of 5k images), short enough that a hung or
#: unreachable node ends the job instead of holding every node forever.
DEFAULT_DIST_TIMEOUT_S = 1800

__all__ = ['CPUDistributedDataParallel', 'CPUFullyShardedDataParallel', 'CPUFSDPStrategy', 'DEFAULT_DIST_TIMEOUT_S',
           'dist_timeout', 'setup_cpu_distributed']


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that drops ``device_ids`` for a module on the CPU (DDP requires that)."""

    def __init__(self, module, device_ids=None, **kwargs):
        if all(p.device.type == 'cpu' for p in module.parameters()):
            device_ids = None
        super().__init__(module=module, device_ids=device_ids, **kwargs)


@MODEL_WRAPPERS.register_module()
class CPUFullyShardedDataParallel(MMFullyShardedDataParallel):
    """``MMFullyShardedDataParallel`` on the CPU: torch's FSDP takes the CPU only as ``device_id=torch.device('cpu')``
    (an integer or ``None`` asks for an accelerator), while mmengine's FSDPStrategy passes ``LOCAL_RANK``."""

    def __init__(self, module, device_id=None, **kwargs):
        if not torch.cuda.is_available():
            device_id = torch.device('cpu')
        # FSDP's sharded optimizer state is made of ShardedTensors, which take contiguous tensors only: parameters
        # kept channels-last (SwiftFormer's convolutions) would make every checkpoint save fail. The parameters
        # are made contiguous here; the activations keep their channels-last layout.
        with torch.no_grad():
            for param in module.parameters():
                if not param.is_contiguous():
                    param.data = param.data.contiguous()
        super().__init__(module=module, device_id=device_id, **kwargs)


@STRATEGIES.register_module()
class CPUFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` whose resume works: mmengine 0.10.7 passes the optimizer state to
    ``FSDP.optim_state_dict_to_load`` positionally in torch 2.0's order ``(state, model, optimizer)``, which torch
    >= 2.1 reads as ``(model, optimizer, state)`` (``TypeError: unhashable type: 'dict'`` on ``--resume``). Passed
    by keyword here. Selected by :func:`setup_cpu_distributed` for ``strategy=dict(type='FSDPStrategy')``."""

    def load_optim_state_dict(self, state_dict: dict) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        optim_state_dict = FSDP.optim_state_dict_to_load(model=self.model, optim=self.optim_wrapper.optimizer,
                                                         optim_state_dict=state_dict)
        self.optim_wrapper.load_state_dict(optim_state_dict)


def dist_timeout(cfg) -> float:
    """The collective timeout in seconds that a distributed run of ``cfg`` uses (validated)."""
    value = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('timeout', DEFAULT_DIST_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f'env_cfg.dist_cfg.timeout must be a positive number of seconds, got {value!r}')
    return float(value)


def _cpu_wrapper(cfg) -> None:
    """Point the model wrapper (Runner) or the strategy's wrapper (FlexibleRunner) at the CPU variants."""
    if cfg.get('runner_type') == 'FlexibleRunner':
        strategy = cfg.get('strategy') or {'type': 'DDPStrategy'}
        kind = strategy.get('type')
        if kind in ('FSDPStrategy', 'DDPStrategy'):
            wrapper = strategy.get('model_wrapper') or {}
            wrapper['type'] = ('mmplugin.CPUFullyShardedDataParallel' if kind == 'FSDPStrategy'
                               else 'mmplugin.CPUDistributedDataParallel')
            if kind == 'DDPStrategy':
                wrapper.setdefault('broadcast_buffers', False)
            strategy['model_wrapper'] = wrapper
        if kind == 'FSDPStrategy':
            strategy['type'] = 'mmplugin.CPUFSDPStrategy'  # resumable (CPUFSDPStrategy)
        cfg.strategy = strategy
        return
    wrapper = cfg.get('model_wrapper_cfg') or {}
    wrapper['type'] = 'mmplugin.CPUDistributedDataParallel'
    cfg.model_wrapper_cfg = wrapper


def setup_cpu_distributed(cfg) -> None:
    """For ``--launcher pytorch``: set the bounded collective timeout (:data:`DEFAULT_DIST_TIMEOUT_S` unless the
    config sets ``env_cfg.dist_cfg.timeout``); without CUDA, also start a gloo process group from torchrun's
    environment with that timeout (mmengine then skips its own CUDA-only initialisation) and use the CPU model
    wrappers."""
    import torch.distributed as dist
    if cfg.get('launcher', 'none') == 'none':
        return
    timeout = dist_timeout(cfg)
    dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    dist_cfg['timeout'] = timeout
    if torch.cuda.is_available():
        return
    if not dist.is_initialized():
        if 'RANK' not in os.environ:
            raise RuntimeError('--launcher pytorch needs torchrun (RANK/WORLD_SIZE unset); use tools/dist_train.sh')
        dist.init_process_group(backend='gloo', timeout=datetime.timedelta(seconds=timeout))
    dist_cfg['backend'] = 'gloo'
    _cpu_wrapper(cfg)
