"""Evaluate a checkpoint (COCO bbox/segm AP, ADE20K mIoU, ...) with an mmdet or mmseg config.

The command line lives in :mod:`mmplugin.cli.test` (``python tools/test.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.test import main

if __name__ == '__main__':
    run_tool(main)
