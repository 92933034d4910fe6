"""Numeric tools of the test suites: tolerances derived from the precision and the size of a computation (never
from the rounding one CPU produces), random weights, and float64 reference runs.
"""
from __future__ import annotations

import math

import torch

__all__ = ['U_FP64', 'U_FP32', 'U_BF16', 'U_FP16', 'PARITY_TERMS', 'PARITY_DEPTH', 'worst_case_bound',
           'probabilistic_bound', 'FP64_PARITY', 'FP32_PARITY', 'BF16_VS_FP32', 'FP16_VS_FP32', 'REDUCED_VS_FP32',
           'randomize_', 'outputs_in_float64']


def randomize_(module: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> torch.nn.Module:
    """Fill every parameter and float buffer with random values so equality tests cannot pass by accident."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if not p.is_floating_point() or 'relative_coords_table' in name:
                continue
            if name.endswith('running_var'):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith('weight') and p.ndim == 1:  # norm gains around 1
                p.copy_(1 + torch.randn(p.shape, generator=g) * scale)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


# ------------------------------------------------------------------------------------------------ numeric bounds
# Every tolerance in the suite comes from the precision and the size of the computation, never from the rounding
# one CPU happens to produce (kernels are chosen by instruction set at run time: AVX2, AVX-512, AVX512-BF16 and
# AMX machines round differently). Two implementations of the same function differ only by rounding; with unit
# roundoff u, a network of `depth` chained layers whose outputs are inner products of at most `terms` terms:
#   * worst case (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5: |error| of a length-K
#     sum <= K u sum|terms|), summed over the chain: terms * depth * u, times a gain of 4 for the normalisations
#     (LayerNorm / BatchNorm divide by a standard deviation of order 1 with these random weights) and softmax;
#   * probabilistic (Higham & Mary 2019, "A new approach to probabilistic rounding error analysis": the error grows
#     like sqrt(K) u with high probability), independent layers adding in quadrature: 4 * u * sqrt(terms * depth).
# The test models are small: at most 4096-term inner products (Swin-T's 3072-wide MLP projection, 3x3x256
# convolutions) and at most 50 chained layers (12 blocks x 4 products + stem + output norm).
U_FP64, U_FP32, U_BF16, U_FP16 = 2.0**-53, 2.0**-24, 2.0**-8, 2.0**-11
PARITY_TERMS, PARITY_DEPTH = 4096, 50


def worst_case_bound(unit: float, terms: int = PARITY_TERMS, depth: int = PARITY_DEPTH) -> float:
    """Worst-case relative rounding error of ``depth`` chained ``terms``-term inner products (see above)."""
    return 4 * unit * terms * depth


def probabilistic_bound(unit: float, terms: int = PARITY_TERMS, depth: int = PARITY_DEPTH) -> float:
    """Relative rounding error that holds with high probability (see above)."""
    return 4 * unit * math.sqrt(terms * depth)


# Two float64 computations of the same function: the worst case, 9.1e-11. Implementation differences (a wrong
# epsilon, a transposed weight, a missing bias) are >= 1e-8 relative, so float64 comparisons catch them all.
FP64_PARITY = worst_case_bound(U_FP64)
# Two float32 computations (eager vs eager with other kernels or fused ops, eager vs onnxruntime): the
# probabilistic estimate, 1.1e-4 (the worst case, 4.9e-2, would prove nothing). Used where float64 cannot run
# (onnxruntime, fused fp32 kernels, whole mmdet models); kernel-independent parity goes through FP64_PARITY.
FP32_PARITY = probabilistic_bound(U_FP32)
# bf16 autocast against fp32: each layer rounds its two operands to bf16 (u = 2^-8) and accumulates in fp32, so
# the error does not grow with the number of terms (it is ~u relative per operand) but adds over the layers in
# quadrature: 2 * u * sqrt(depth) = 5.5e-2.
BF16_VS_FP32 = 2 * U_BF16 * math.sqrt(PARITY_DEPTH)
# fp16 against fp32, the same argument with fp16's unit roundoff (u = 2^-11): 6.9e-3. It holds as long as no value
# leaves fp16's range (|x| <= 65504, normal from 6.1e-5): the reductions that would (L2 norms with their 1e-12
# epsilon, sums of squares) run in fp32 (mmplugin.models.layers.precision). A whole model cast to fp16 (weights,
# activations and the residual stream stored in fp16) rounds once more per layer, a third rounding per layer in
# quadrature: sqrt(3) u sqrt(depth) = 5.9e-3, still within the bound; likewise for bf16.
FP16_VS_FP32 = 2 * U_FP16 * math.sqrt(PARITY_DEPTH)
REDUCED_VS_FP32 = {'bf16': BF16_VS_FP32, 'fp16': FP16_VS_FP32}


def outputs_in_float64(model: torch.nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """``model(*inputs)`` computed on a float64 copy (the model itself is left as it is)."""
    import copy
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        out = m(*(x.double() for x in inputs))
    return list(out) if isinstance(out, (tuple, list)) else [out]
