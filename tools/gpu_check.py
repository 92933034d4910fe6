"""One prepared GPU check (a few minutes): SDPA backend of the Swin window attention, Mask R-CNN training steps with
fp16 AMP and bf16 for the plugin's Swin-T and SwiftFormer-L1 and for mmdet's own Swin-T config, with throughput and
peak memory side by side.

The command line lives in :mod:`mmplugin.cli.gpu_check` (``python tools/gpu_check.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.gpu_check import main

if __name__ == '__main__':
    run_tool(main)
