"""``--compile``, ``--fast [MODE]`` and ``--runtime`` of tools/test.py and tools/infer.py: their arguments, and
applying them to a loaded model (:mod:`mmplugin.inference`)."""
from __future__ import annotations

from mmplugin.cli.common import CfgOptionError

__all__ = ['add_inference_options', 'apply_inference_options']


def add_inference_options(p) -> None:
    """``--compile``, ``--fast [MODE]`` and ``--runtime`` of tools/test.py and tools/infer.py
    (:mod:`mmplugin.inference`)."""
    p.add_argument('--compile', action='store_true',
                   help='torch.compile the backbone and neck (fullgraph, dynamic shapes); pays off on GPUs')
    p.add_argument('--fast', nargs='?', const='auto', choices=('auto', 'bf16', 'fp16'), default=None,
                   help='backbone + neck in reduced precision, heads fp32 (auto: bf16 on CPUs with AVX512-BF16/AMX '
                        'and on Ampere+ GPUs, fp16 on older GPUs; fp32 with a warning elsewhere). Before positional '
                        'arguments write --fast=MODE')
    from mmplugin.inference.runtime import RUNTIMES
    p.add_argument('--runtime', choices=RUNTIMES, default='pytorch',
                   help='where backbone + neck run (CPU): openvino / onnxruntime export them to ONNX once after '
                        'loading, OpenVINO compiles one model per input shape (cached); heads stay in PyTorch. '
                        'With --fast: OpenVINO in bf16 where the CPU has bf16 kernels')


def apply_inference_options(model, args, device):
    """Apply ``--runtime``, ``--fast`` and ``--compile`` to ``model`` (weights loaded) and print what runs where.

    Returns the :class:`mmplugin.inference.runtime.RuntimeFeatures` in use (None on the PyTorch path), whose
    ``message()`` the tool prints again at the end with the compile count."""
    if args.runtime != 'pytorch':
        if args.compile:
            raise CfgOptionError(f'--compile compiles the PyTorch backbone + neck; with --runtime {args.runtime} '
                                 'they run in that runtime: pass one of them')
        from mmplugin.inference.runtime import enable_runtime
        feats = enable_runtime(model, args.runtime, args.fast, device)
        print(feats.message(), flush=True)
        return feats
    if args.fast:
        from mmplugin.inference.fast import enable_fast_inference, fast_inference_message
        dtype = enable_fast_inference(model, args.fast, device)
        print(fast_inference_message(args.fast, dtype))
    if args.compile:
        from mmplugin.inference.fast import compile_backbone_and_neck
        compile_backbone_and_neck(model)  # in place: the checkpoint's keys still match
    return None
