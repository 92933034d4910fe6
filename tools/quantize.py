"""Post-training static int8 of a detector's / segmentor's backbone (+ neck), calibrated on its training split.

The command line lives in :mod:`mmplugin.cli.quantize` (``python tools/quantize.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.quantize import main

if __name__ == '__main__':
    run_tool(main)
