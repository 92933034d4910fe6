"""Latency table of eager fp32 and the export runtimes (onnxruntime, ExecuTorch + XNNPACK, LiteRT; more rows from
``--rows module:function`` builders such as int8 paths), side by side in one process on this CPU.

The command line lives in :mod:`mmplugin.cli.edge_table` (``python tools/edge_table.py --help``).
"""
from mmplugin.cli.common import run_tool
from mmplugin.cli.edge_table import main

if __name__ == '__main__':
    run_tool(main)
