"""Export a two-stage detector (Mask R-CNN, Cascade Mask R-CNN) end to end (boxes, labels, masks) with mmdeploy 1.3.1 to
onnxruntime, then compare onnxruntime with mmdet's ``predict`` at other sizes.

The command line lives in :mod:`mmplugin.cli.export_mmdeploy` (``python tools/export_mmdeploy.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.export_mmdeploy import main

if __name__ == '__main__':
    run_tool(main)
