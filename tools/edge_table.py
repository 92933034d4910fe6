"""Latency table of eager fp32 and the export runtimes (onnxruntime, ExecuTorch + XNNPACK, LiteRT; more rows from
``--rows module:function`` builders such as int8 paths), side by side in one process on this CPU.

    python tools/edge_table.py [--models swiftformer_xs swiftformer_l1_semfpn ...] [--size 512] [--rounds 10]
        [--threads 2] [--runtimes onnx executorch litert] [--rows pkg.module:function ...] [--workdir DIR]
        [--out table.md]

Prints a markdown table (ms, speed-up over eager fp32, max relative error or task metric, file size, CPU);
see :mod:`mmplugin.deploy.bench` and docs/deploy_edge.md. A runtime that is not installed is skipped with a note.

The command line lives in :mod:`mmplugin.cli.edge_table`.
"""
from mmplugin.cli.edge_table import main
from mmplugin.utils.cli import run_tool

if __name__ == '__main__':
    run_tool(main)
