"""Convert an official / timm / OpenMMLab backbone checkpoint (any registered family) to the plugin's format, or a
whole-model (detector / segmentor) checkpoint to the model of a config.

The command line lives in :mod:`mmplugin.cli.convert_checkpoint` (``python tools/convert_checkpoint.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.convert_checkpoint import main

if __name__ == '__main__':
    run_tool(main)
