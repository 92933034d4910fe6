"""Evaluate a checkpoint (COCO bbox/segm AP, ADE20K mIoU, ...) with an mmdet or mmseg config.

The command line lives in :mod:`mmplugin.cli.test` (``python tools/test.py --help``).
"""
from mmplugin.cli.test import main
from mmplugin.utils.cli import run_tool

if __name__ == '__main__':
    run_tool(main)
