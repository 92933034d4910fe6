"""Export a detector's / segmentor's backbone, backbone + neck, or whole segmentor to ONNX with dynamic batch, height
and width, then check onnxruntime against PyTorch eager at other sizes.

The command line lives in :mod:`mmplugin.cli.export` (``python tools/export.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.export import main

if __name__ == '__main__':
    run_tool(main)
