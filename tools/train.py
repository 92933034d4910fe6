"""Train an mmdet or mmseg model from a config, with the plugin's backbones registered.

The command line lives in :mod:`mmplugin.cli.train` (``python tools/train.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.train import main

if __name__ == '__main__':
    run_tool(main)
