"""Pictures, loss curves and the summary table of ``tools/demo.sh``.

The command line lives in :mod:`mmplugin.cli.demo_report` (``python tools/demo_report.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.demo_report import main

if __name__ == '__main__':
    run_tool(main)
