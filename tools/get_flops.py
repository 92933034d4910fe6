"""Parameters and GMACs of the plugin's backbones (every registered family and arch, or one family), or of whole models
built from configs.

The command line lives in :mod:`mmplugin.cli.get_flops` (``python tools/get_flops.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.get_flops import main

if __name__ == '__main__':
    run_tool(main)
