"""Post-training static int8 of a detector's / segmentor's backbone (+ neck), calibrated on its training split.

    python tools/quantize.py CONFIG CHECKPOINT --backend xnnpack|onnxruntime [--out DIR]
        [--part backbone|backbone+neck] [--keep-float attention_norm|attention|none|NAME ...] [--num-calib 32]
        [--eval] [--cfg-options ...]

``xnnpack``: PT2E quantisation lowered to an ExecuTorch ``.pte`` (XNNPACK delegate, run through ExecuTorch's
runtime); ``onnxruntime``: static QDQ ONNX. Fixed input shape (the first calibration image's, batch 1). Without
``--eval`` it writes the int8 file and prints the lowest output cosine against fp32; with ``--eval`` it evaluates
fp32 and int8 on the config's test split (same checkpoint, same images, heads in float): docs/int8.md.
Needs the ``edge`` extra (executorch, torchao) for ``xnnpack`` and onnxruntime for ``onnxruntime``.

The command line lives in :mod:`mmplugin.cli.quantize`.
"""
from mmplugin.cli.quantize import main
from mmplugin.utils.cli import run_tool

if __name__ == '__main__':
    run_tool(main)
