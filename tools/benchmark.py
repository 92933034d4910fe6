"""Backbone speed and peak memory, side by side in one process, printed as ratios and drawn as a PNG.

The command line lives in :mod:`mmplugin.cli.benchmark` (``python tools/benchmark.py --help``).
"""
from mmplugin.cli.benchmark import main
from mmplugin.cli.common import run_tool

if __name__ == '__main__':
    run_tool(main)
