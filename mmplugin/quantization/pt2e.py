"""Post-training static int8 for the XNNPACK path: PT2E quantisation, ExecuTorch ``.pte`` lowering and its runtime.

Flow (``image (1, 3, H, W)`` in, the part's tuple of maps out, fixed size):

1. :func:`int8_ready` copies the part, folds BatchNorms and layer scales (``switch_to_deploy()``: weights become
   constants a delegate can take), turns channels-last off (its ``_clone_dim_order`` ops are not delegated) and
   rewrites SwiftFormer's additive attention as :class:`Int8AdditiveAttention` (the model's attention with its
   token scores as a linear; each L2 normalisation is the model's own :class:`L2Norm` module), same numbers;
2. :func:`quantize_pt2e` captures it with ``torch.export``, annotates it with ExecuTorch's ``XNNPACKQuantizer``
   (int8 activations per tensor, asymmetric; int8 weights per output channel, symmetric), runs the calibration
   images through the observers and converts: a ``GraphModule`` with quantize / dequantize pairs, runnable in
   PyTorch (reference int8 arithmetic in fp32 kernels);
3. :func:`export_xnnpack` lowers that graph with the XNNPACK partitioner to a ``.pte`` file and
   :class:`PteRunner` runs it through ExecuTorch's Python runtime (real int8 kernels).

What stays float (``keep_float``): module class names or qualified module names, or the presets of
:data:`KEEP_FLOAT_PRESETS`. Measured on the demo models (docs/int8.md): quantising the L2 normalisations'
``x * rsqrt(sum(x * x))`` products costs most of the error (their int8 grid is coarse against unit-norm tokens),
so the XNNPACK default keeps :class:`L2Norm` float; onnxruntime's QDQ path (coarser min/max calibration) keeps the
whole additive attention float (:data:`DEFAULT_KEEP_FLOAT_BY_BACKEND`, measured on three demo checkpoints).

Requires the ``edge`` extra: ``executorch`` (1.5.1 tested with torch 2.13) and ``torchao`` (0.18).
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mmplugin.models.backbones.swiftformer.attention import EfficientAdditiveAttention, L2Norm

__all__ = ['KEEP_FLOAT_PRESETS', 'DEFAULT_KEEP_FLOAT', 'DEFAULT_KEEP_FLOAT_BY_BACKEND', 'default_keep_float', 'L2Norm',
           'Int8AdditiveAttention', 'int8_ready',
           'resolve_keep_float', 'quantize_pt2e', 'float_modules_in_graph', 'export_xnnpack', 'PteRunner',
           'cosine']

#: named choices of what stays float; values are module class names (matched against ``type(m).__name__``)
KEEP_FLOAT_PRESETS = {
    'none': (),
    'attention_norm': ('L2Norm', ),  # the three L2 normalisations of every additive attention
    'attention': ('Int8AdditiveAttention', ),  # the whole additive attention (projections included)
}
DEFAULT_KEEP_FLOAT = 'attention_norm'
#: the default per backend: the preset that held the 0.01 AP budget on every demo checkpoint measured (docs/int8.md)
DEFAULT_KEEP_FLOAT_BY_BACKEND = {'xnnpack': 'attention_norm', 'onnxruntime': 'attention'}


def default_keep_float(backend: str, keep_float=None):
    """``keep_float`` as given, or the backend's default when it is None."""
    if keep_float is not None:
        return keep_float
    if backend not in DEFAULT_KEEP_FLOAT_BY_BACKEND:
        raise ValueError(f'backend must be one of {tuple(DEFAULT_KEEP_FLOAT_BY_BACKEND)}, got {backend!r}')
    return DEFAULT_KEEP_FLOAT_BY_BACKEND[backend]


class Int8AdditiveAttention(EfficientAdditiveAttention):
    """SwiftFormer's additive attention (``(B, N, C)`` tokens in and out) as PT2E int8 annotates it.

    The model's own attention (same forward, same :class:`L2Norm` modules) with one change: the token scores
    ``q w_g / sqrt(C)`` are a bias-free ``nn.Linear(C, 1)`` holding ``w_g / sqrt(C)``, a static weight that the
    quantiser annotates and XNNPACK takes (``(q @ w_g) * scale`` is a matmul on a parameter and a float multiply).
    Built from a deployed attention (layer scale folded into ``final``); shares its linears, and calls them as
    modules where exported, so that ``keep_float`` by module name or type reaches them.
    """

    def __init__(self, attn: EfficientAdditiveAttention):
        nn.Module.__init__(self)
        dim = attn.to_query.in_features
        self.token_weighting = attn.token_weighting
        self.to_query, self.to_key, self.proj, self.final = attn.to_query, attn.to_key, attn.proj, attn.final
        self.q_norm, self.k_norm, self.token_norm = attn.q_norm, attn.k_norm, attn.token_norm
        self.token_score = nn.Linear(dim, 1, bias=False)
        with torch.no_grad():
            self.token_score.weight.copy_(attn.w_g.detach().reshape(1, dim) * attn.scale)

    def token_scores(self, q: torch.Tensor) -> torch.Tensor:
        return self.token_score(q)  # (B, N, 1)

    def forward(self, x: torch.Tensor, out_scale: torch.Tensor | None = None) -> torch.Tensor:
        if out_scale is not None:
            raise RuntimeError('Int8AdditiveAttention expects the layer scale folded (switch_to_deploy() first)')
        return super().forward(x)


def int8_ready(module: nn.Module) -> nn.Module:
    """A copy of ``module`` in eval mode, deployed (BN / layer scales folded), channels-last off, with every
    SwiftFormer additive attention replaced by :class:`Int8AdditiveAttention`. ``module`` is left unchanged."""
    m = copy.deepcopy(module).eval()
    for sub in list(m.modules()):
        if hasattr(sub, 'channels_last'):
            sub.channels_last = False
        if callable(getattr(sub, 'switch_to_deploy', None)) and type(sub).__name__ == 'SwiftFormer':
            sub.switch_to_deploy(prepack=False)  # int8 graphs never read packed fp32 / bf16 weights
    for parent in list(m.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is EfficientAdditiveAttention:
                setattr(parent, name, Int8AdditiveAttention(child))
    return m


def resolve_keep_float(module: nn.Module, keep_float: str | Iterable[str]) -> tuple[list[type], list[str]]:
    """``keep_float`` (a preset name, or class / qualified module names) -> (module types, module names).

    Raises ValueError naming an entry that is neither a preset, a class present in ``module`` nor a submodule.
    """
    entries = [keep_float] if isinstance(keep_float, str) else list(keep_float)
    names = dict(module.named_modules())
    types = {type(m).__name__: type(m) for m in names.values()}
    out_types: list[type] = []
    out_names: list[str] = []
    for e in entries:
        if not isinstance(e, str):
            raise ValueError(f'keep_float entries must be strings, got {e!r}')
        for item in KEEP_FLOAT_PRESETS.get(e, (e, )):
            if item in types:
                out_types.append(types[item])
            elif item in names and item:
                out_names.append(item)
            elif item in ('L2Norm', 'Int8AdditiveAttention'):
                continue  # a preset whose modules this model does not have (no additive attention)
            else:
                raise ValueError(f'keep_float: {item!r} is neither a preset ({", ".join(KEEP_FLOAT_PRESETS)}), a '
                                 f'module class of {type(module).__name__} nor one of its submodule names')
    return out_types, out_names


def _quantizer(module: nn.Module, keep_float):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    types, names = resolve_keep_float(module, keep_float)
    for t in types:
        quantizer.set_module_type(t, None)
    for n in names:
        quantizer.set_module_name(n, None)
    return quantizer


def quantize_pt2e(module: nn.Module, calibration: Sequence[torch.Tensor], keep_float=DEFAULT_KEEP_FLOAT,
                  example: torch.Tensor | None = None) -> torch.fx.GraphModule:
    """PT2E static int8 of ``module`` (prepared by :func:`int8_ready`), calibrated on ``calibration`` images.

    Args:
        module: ``image (1, 3, H, W) -> tuple of maps``, already :func:`int8_ready`.
        calibration: images ``(1, 3, H, W)`` at the export size, preprocessed like the model's inputs.
        keep_float: preset or names, see :func:`resolve_keep_float`.
        example: capture input (default ``calibration[0]``).
    Returns the converted ``GraphModule`` (quantize / dequantize pairs around int8-annotated ops).
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    if not calibration:
        raise ValueError('quantize_pt2e needs at least one calibration image')
    example = calibration[0] if example is None else example
    shape = tuple(example.shape)
    for i, x in enumerate(calibration):
        if tuple(x.shape) != shape:
            raise ValueError(f'calibration image {i} has shape {tuple(x.shape)}; the export size is {shape}')
    quantizer = _quantizer(module, keep_float)
    from mmplugin.export.rewrites import for_delegates
    graph = for_delegates(torch.export.export(module.eval(), (example, ), strict=False)).module()
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for x in calibration:
            prepared(x)
    return _convert_post_training(prepared, convert_pt2e)


def _convert_post_training(prepared: torch.fx.GraphModule, convert_pt2e) -> torch.fx.GraphModule:
    """``convert_pt2e`` without its QAT conv-BN fold.

    torchao's ``convert_pt2e`` runs ``_fold_conv_bn_qat`` whenever the graph holds a BatchNorm (the plugin's parts
    keep the BatchNorms that follow an activation): it exports 96 pattern graphs (about 25 s on 2 cores) to find
    the conv-BN patterns that ``prepare_qat_pt2e`` inserts for quantisation-aware training. A graph prepared by
    ``prepare_pt2e`` (post-training) has none, so the fold cannot change it; it is skipped. Where torchao no longer
    has that function the full conversion runs.
    """
    from unittest import mock

    import torchao.quantization.pt2e.quantize_pt2e as tq
    if not hasattr(tq, '_fold_conv_bn_qat'):
        return convert_pt2e(prepared)
    with mock.patch.object(tq, '_fold_conv_bn_qat', lambda graph: graph):
        return convert_pt2e(prepared)


def float_modules_in_graph(graph: torch.fx.GraphModule, module_type: str) -> tuple[int, int]:
    """``(float, quantised)`` counts of compute nodes (mul / linear / conv / add) recorded under modules of class
    ``module_type`` in a converted PT2E graph. A node is quantised when every tensor input comes from a
    dequantize and its output goes to a quantize (the int8 pattern a delegate fuses); a float node reads at least
    one float tensor or writes a float one (its inputs may still be dequantised outputs of quantised producers)."""
    float_n = quant_n = 0
    for node in graph.graph.nodes:
        name = str(node.target)
        if node.op != 'call_function' or 'quantize' in name:
            continue
        if not any(k in name for k in ('mul', 'linear', 'conv', 'add')):
            continue
        stack = node.meta.get('nn_module_stack') or {}
        if not any(str(t).split('.')[-1].strip("'>") == module_type for _, t in stack.values()):
            continue
        inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if 'linear' in name or 'conv' in name:
            inputs = inputs[:1]  # the activation (weights are dequantised constants or float parameters)
        deq_in = bool(inputs) and all('dequantize' in str(a.target) for a in inputs)
        q_out = any('quantize' in str(u.target) and 'dequantize' not in str(u.target) for u in node.users)
        quant_n += deq_in and q_out
        float_n += not (deq_in and q_out)
    return float_n, quant_n


def export_xnnpack(module: nn.Module, example: torch.Tensor, out: str) -> str:
    """Lower ``module`` (a converted PT2E graph, or a float module) with the XNNPACK partitioner to ``out`` (.pte)."""
    import executorch.kernels.quantized  # noqa: F401  (registers the quantized ops that to_executorch needs)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from mmplugin.export.rewrites import for_delegates
    program = for_delegates(torch.export.export(module, (example, ), strict=False))
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    et = edge.to_executorch()
    with open(out, 'wb') as f:
        et.write_to_file(f)
    return out


class PteRunner:
    """Runs a ``.pte`` through ExecuTorch's Python runtime: ``runner(x) -> tuple of tensors``.

    The program has the export's fixed input shape; another shape is a ValueError (not a runtime abort).
    """

    def __init__(self, path: str, shape: Sequence[int]):
        from executorch.runtime import Runtime
        self.program = Runtime.get().load_program(path)
        self.method = self.program.load_method('forward')
        self.shape = tuple(shape)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if tuple(x.shape) != self.shape:
            raise ValueError(f'this .pte takes input shape {self.shape}, got {tuple(x.shape)}')
        return tuple(self.method.execute([x.contiguous().float()]))


def cosine(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """Lowest cosine similarity over the outputs (flattened) of two runs."""
    return min(F.cosine_similarity(x.flatten().double(), y.flatten().double(), dim=0).item() for x, y in zip(a, b))
