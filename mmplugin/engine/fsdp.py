"""FSDP through mmengine's ``FSDPStrategy`` (what ``runner_type='FlexibleRunner'`` uses): a wrap policy a config
can name, and a per-rank memory report for a model config (``tools/fsdp_memory.py``).

A config trains with FSDP by adding::

    runner_type = 'FlexibleRunner'
    strategy = dict(type='FSDPStrategy', model_wrapper=dict(auto_wrap_policy=dict(type='mmplugin.block_wrap_policy')))

Only modules that their parent calls (``module(x)``) may become FSDP units: FSDP gathers a unit's parameters in
its ``forward``, so a parent that reaches into a wrapped child's submodules (``stage.downsample(x)``) would see the
flat shards. The plugin's blocks are such units; torch's size-based policy is not safe for the backbones.

On CPUs, :func:`mmplugin.engine.ddp.setup_cpu_distributed` swaps the wrapper for
:class:`~mmplugin.engine.ddp.CPUFullyShardedDataParallel` (gloo).
"""
from __future__ import annotations

import gc
import os
import resource

import torch

from mmplugin.registry import FUNCTIONS

__all__ = ['block_wrap_policy', 'fsdp_memory_report']


def _block_classes() -> tuple[type, ...]:
    from mmplugin.models.backbones.swiftformer.blocks import ConvEncoder
    from mmplugin.models.backbones.swiftformer.model import SwiftFormerEncoder
    from mmplugin.models.backbones.swin.model import SwinBlock
    from mmplugin.models.necks.global_attention import GlobalAttentionBlock
    return SwinBlock, SwiftFormerEncoder, ConvEncoder, GlobalAttentionBlock


@FUNCTIONS.register_module()
def block_wrap_policy(module, recurse: bool, nonwrapped_numel: int, min_num_params: int = 0) -> bool:
    """FSDP auto-wrap policy: every Swin / SwinV2 block, SwiftFormer encoder and global-attention block with at
    least ``min_num_params`` parameters becomes its own FSDP unit (its parameters are gathered only while it runs);
    everything else (stems, patch merging, necks, heads) stays in the root unit."""
    if recurse:
        return True
    return isinstance(module, _block_classes()) and nonwrapped_numel >= int(min_num_params)


def _rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB."""
    cur = 0.0
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                cur = int(line.split()[1]) / 1024
    return cur, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _det_batch(model, size: int):
    """A packed 1-image mmdet batch: boxes, masks, and a semantic map when the model has a semantic head."""
    from mmdet.testing import demo_mm_inputs
    semantic = bool(getattr(getattr(model, 'roi_head', None), 'with_semantic', False))
    packed = demo_mm_inputs(batch_size=1, image_shapes=[(3, size, size)], num_items=[3], with_mask=True,
                            with_semantic=semantic)
    return packed


def fsdp_memory_report(cfg, min_num_params: int = 0, step_size: int | None = None) -> dict:
    """Build ``cfg.model`` on every rank, shard it with FSDP (FULL_SHARD, :func:`block_wrap_policy`), and measure.

    Run under torchrun with an initialised process group. ``step_size``: also run one AdamW training step (forward,
    backward, update) on a ``step_size`` x ``step_size`` synthetic detection batch.

    Returns this rank's figures: full and local (sharded) parameter counts and bytes, RSS after sharding and, with a
    step, the loss and the peak RSS.
    """
    from functools import partial

    import torch.distributed as dist
    from mmengine.registry import MODELS, init_default_scope

    from mmplugin.engine.ddp import CPUFullyShardedDataParallel
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    full = sum(p.numel() for p in model.parameters())
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    built_rss = _rss_mib()[0]
    device_id = int(os.environ.get('LOCAL_RANK', 0)) if torch.cuda.is_available() else None
    model = CPUFullyShardedDataParallel(
        model, device_id=device_id, auto_wrap_policy=partial(block_wrap_policy, min_num_params=min_num_params),
        sharding_strategy='FULL_SHARD', use_orig_params=True)
    gc.collect()
    local = sum(p.numel() for p in model.parameters())
    out = dict(rank=dist.get_rank(), world_size=dist.get_world_size(), params_full=full, params_local=local,
               param_mib_full=full_bytes / 2 ** 20,
               param_mib_local=sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 20,
               rss_mib_built=built_rss, rss_mib_sharded=_rss_mib()[0])
    if step_size:
        from mmengine.optim import OptimWrapper
        optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-4))
        model.train()
        log_vars = model.train_step(_det_batch(model.module, step_size), optim)  # what FlexibleRunner runs
        out.update(loss=float(log_vars['loss']), rss_mib_step_peak=_rss_mib()[1],
                   optim_state_mib_local=sum(t.numel() * t.element_size() for s in optim.optimizer.state.values()
                                             for t in s.values() if torch.is_tensor(t) and t.ndim) / 2 ** 20)
    out['pid'] = os.getpid()
    return out
