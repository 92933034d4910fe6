"""Per-rank parameter memory of a detector config sharded with FSDP (gloo on CPU, NCCL on GPU), and optionally one
training step on a synthetic image.

    torchrun --nproc-per-node 2 tools/fsdp_memory.py configs/swin/swin_l_htcpp_nosemantic_6x_coco.py [--step-size 256]
        [--min-num-params 0] [--cfg-options key=value ...]

Every rank prints one line ``fsdp-memory {json}``. docs/distributed.md has the figures.
"""
from __future__ import annotations

import argparse
import datetime
import json

from mmplugin.cli.common import run_tool, tool_main


@tool_main
def main(argv=None) -> int:
    from mmplugin.cli.common import CfgOptionsAction
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('--step-size', type=int, default=None, help='also run one training step on an NxN image')
    p.add_argument('--min-num-params', type=int, default=0, help='smallest block that becomes an FSDP unit')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    import mmplugin  # noqa: F401
    from mmplugin.apis import load_config
    from mmplugin.engine.ddp import DEFAULT_DIST_TIMEOUT_S
    from mmplugin.engine.fsdp import fsdp_memory_report
    cfg = load_config(args.config, args.cfg_options)  # a missing file: one error line (tool_main)
    dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo',
                            timeout=datetime.timedelta(seconds=DEFAULT_DIST_TIMEOUT_S))
    try:
        print('fsdp-memory ' + json.dumps(fsdp_memory_report(cfg, args.min_num_params, args.step_size)), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == '__main__':
    run_tool(main)
