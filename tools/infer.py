"""Run a trained detector or segmentor on an image or a folder of images; draw and / or save its predictions.

The command line lives in :mod:`mmplugin.cli.infer` (``python tools/infer.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.infer import main

if __name__ == '__main__':
    run_tool(main)
