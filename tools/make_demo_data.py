"""Generate the demo datasets (deterministic): COCO-format shapes and ADE20K-layout shapes.

The command line lives in :mod:`mmplugin.cli.make_demo_data` (``python tools/make_demo_data.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.make_demo_data import main

if __name__ == '__main__':
    run_tool(main)
