"""Per-rank parameter memory of a detector config sharded with FSDP (gloo on CPU, NCCL on GPU), and optionally one
training step on a synthetic image.

The command line lives in :mod:`mmplugin.cli.fsdp_memory` (``python tools/fsdp_memory.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.fsdp_memory import main

if __name__ == '__main__':
    run_tool(main)
