"""``--compile``, ``--fast [MODE]`` and ``--runtime`` of tools/test.py and tools/infer.py: their arguments, and
applying them to a loaded model (:mod:`mmplugin.inference`)."""
from __future__ import annotations

from mmplugin.cli.common import CfgOptionError

__all__ = ['COMPILE_MODES', 'add_inference_options', 'apply_inference_options']

COMPILE_MODES = ('dynamic', 'static')


def add_inference_options(p) -> None:
    """``--compile``, ``--fast [MODE]`` and ``--runtime`` of tools/test.py and tools/infer.py
    (:mod:`mmplugin.inference`)."""
    p.add_argument('--compile', nargs='?', const='dynamic', choices=COMPILE_MODES, default=None,
                   help='torch.compile backbone + neck. dynamic (the default): one graph for every size, pays off on '
                        'GPUs. static: one graph per input size with frozen weights (oneDNN weight prepacking), for '
                        'SwiftFormer the fastest CPU path at fixed sizes (Swin runs faster eager, with its attention '
                        'kernel); the first '
                        'image of each size pays a compile of about a minute. Before positional arguments write '
                        '--compile=MODE')
    p.add_argument('--compile-sizes', type=int, default=None, metavar='N',
                   help='--compile static: input sizes that get a graph; images of further sizes run eager (default 8)')
    p.add_argument('--fast', nargs='?', const='auto', choices=('auto', 'bf16', 'fp16'), default=None,
                   help='backbone + neck in reduced precision, heads fp32 (auto: bf16 on CPUs with AVX512-BF16/AMX '
                        'and on Ampere+ GPUs, fp16 on older GPUs; fp32 with a warning elsewhere); on a CPU also '
                        'linear and 1x1 convolution weights kept packed in oneDNN\'s layout (one more copy of them '
                        'in memory). Before positional arguments write --fast=MODE')
    from mmplugin.inference.runtime import RUNTIMES
    p.add_argument('--runtime', choices=RUNTIMES, default='pytorch',
                   help='where backbone + neck run (CPU): openvino / onnxruntime export them to ONNX once after '
                        'loading, OpenVINO compiles one model per input shape (cached); heads stay in PyTorch. '
                        'With --fast: OpenVINO in bf16 where the CPU has bf16 kernels')


def apply_inference_options(model, args, device):
    """Apply ``--runtime``, ``--fast`` and ``--compile`` to ``model`` (weights loaded) and print what runs where.

    Returns the :class:`mmplugin.inference.runtime.RuntimeFeatures` or
    :class:`mmplugin.inference.compiled.StaticCompiledFeatures` in use (None otherwise), whose ``message()`` the
    tool prints again at the end with the compile count."""
    sizes = getattr(args, 'compile_sizes', None)
    if sizes is not None and args.compile != 'static':
        raise CfgOptionError('--compile-sizes sets how many input sizes --compile static compiles; pass --compile '
                             'static with it, or drop it')
    if args.runtime != 'pytorch':
        if args.compile:
            raise CfgOptionError(f'--compile compiles the PyTorch backbone + neck; with --runtime {args.runtime} '
                                 'they run in that runtime: pass one of them')
        from mmplugin.inference.runtime import enable_runtime
        feats = enable_runtime(model, args.runtime, args.fast, device)
        print(feats.message(), flush=True)
        return feats
    feats = None
    if args.compile == 'static':
        # before --fast: its autocast then wraps the compiled function and is captured in each graph
        from mmplugin.inference.compiled import enable_static_compile
        feats = enable_static_compile(model, 8 if sizes is None else sizes)
    if args.fast:
        from mmplugin.inference.fast import enable_fast_inference, fast_inference_message
        dtype = enable_fast_inference(model, args.fast, device)
        print(fast_inference_message(args.fast, dtype, model))
    if feats is not None:
        print(feats.message(), flush=True)
        return feats
    if args.compile == 'dynamic':
        from mmplugin.inference.fast import compile_backbone_and_neck
        compile_backbone_and_neck(model)  # in place: the checkpoint's keys still match
    return None
