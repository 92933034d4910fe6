"""Backbone speed against the CPU's own matmul peak, the peers and the deployment runtimes, in one process.

The command line lives in :mod:`mmplugin.cli.speed_table` (``python tools/speed_table.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.speed_table import main

if __name__ == '__main__':
    run_tool(main)
