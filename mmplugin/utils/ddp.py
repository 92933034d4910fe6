"""Data-parallel training on CPUs (gloo): mmengine 0.10.7 assumes a GPU per process (``torch.cuda.set_device``,
``device_ids=[LOCAL_RANK]``); these helpers let the same Runner run multi-process on CPU-only machines."""
from __future__ import annotations

import os

import torch
from mmengine.model import MMDistributedDataParallel

from ..registry import MODEL_WRAPPERS


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that drops ``device_ids`` for a module on the CPU (DDP requires that)."""

    def __init__(self, module, device_ids=None, **kwargs):
        if all(p.device.type == 'cpu' for p in module.parameters()):
            device_ids = None
        super().__init__(module=module, device_ids=device_ids, **kwargs)


def setup_cpu_distributed(cfg) -> None:
    """For ``--launcher pytorch`` without CUDA: start a gloo process group from torchrun's environment (mmengine
    then skips its own CUDA-only initialisation) and use :class:`CPUDistributedDataParallel`."""
    import torch.distributed as dist
    if torch.cuda.is_available() or cfg.get('launcher', 'none') == 'none':
        return
    if not dist.is_initialized():
        if 'RANK' not in os.environ:
            raise RuntimeError('--launcher pytorch needs torchrun (RANK/WORLD_SIZE unset); use tools/dist_train.sh')
        dist.init_process_group(backend='gloo')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or {}
    wrapper['type'] = 'mmplugin.CPUDistributedDataParallel'
    cfg.model_wrapper_cfg = wrapper
