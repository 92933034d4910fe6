"""The SwiftFormer paper's Table 3 comparison measured on this CPU (parameters, GMACs, latency, paper accuracy).

The command line lives in :mod:`mmplugin.cli.table3` (``python tools/table3.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.table3 import main

if __name__ == '__main__':
    run_tool(main)
