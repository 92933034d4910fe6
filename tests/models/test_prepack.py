"""Prepacked linear weights (``mmplugin.models.layers.prepack``): the fused inference linears compute the plain ops'
function with the packed copies (fp32, and bf16 under CPU autocast), a weight updated in place is packed again,
training and unfrozen weights never read a packed copy, the copies are released, and a whole backbone with prepacked
weights gives the outputs of the same backbone without them, its state dict untouched."""
from __future__ import annotations

import copy
import gc
import io

import pytest
import torch
from conftest import FP32_PARITY, tiny_backbone
from torch import nn

from mmplugin.models.layers import prepack
from mmplugin.models.layers.fusion import _onednn_bf16, linear, linear_act, linear_add
from mmplugin.testing.numeric import REDUCED_VS_FP32
from mmplugin.utils.numerics import max_rel_error

pytestmark = pytest.mark.skipif(not prepack._AVAILABLE, reason='this torch build has no oneDNN weight reorder')

CASES = {
    'linear': (lambda x, lay, r: linear(x, lay), lambda x, lay, r: nn.functional.linear(x, lay.weight, lay.bias)),
    'gelu': (lambda x, lay, r: linear_act(x, lay, 'gelu'),
             lambda x, lay, r: nn.functional.gelu(nn.functional.linear(x, lay.weight, lay.bias))),
    'add': (lambda x, lay, r: linear_add(x, lay, r),
            lambda x, lay, r: nn.functional.linear(x, lay.weight, lay.bias) + r),
}


def _operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(40, 72)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(72, 40, generator=g) * 0.2)
        layer.bias.copy_(torch.randn(72, generator=g))
    return layer, torch.randn(2, 5, 7, 40, generator=g), torch.randn(2, 5, 7, 72, generator=g)


def _packed_keys(module):
    return {key for key in prepack._PACKED if key[0] in {id(p) for p in module.parameters()}}


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
@pytest.mark.parametrize('case', list(CASES))
def test_prepacked_linears_compute_the_plain_ops(case, dtype):
    """With the weight frozen, the fused op reads the packed copy (one per parameter and dtype) and returns the
    plain ops' result in float64 within fp32 rounding (bf16 autocast: within bf16's bound)."""
    if dtype == 'bf16' and not _onednn_bf16():
        pytest.skip('oneDNN has no bf16 kernels on this CPU')
    fused, plain = CASES[case]
    layer, x, r = _operands()
    ref_layer = copy.deepcopy(layer).double()
    ref = plain(x.double(), ref_layer, r.double())
    prepack.prepack_weights(layer)
    try:
        with torch.inference_mode(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bf16'):
            got = fused(x, layer, r)
        low = torch.bfloat16 if dtype == 'bf16' else torch.float32
        assert _packed_keys(layer) == {(id(layer.weight), low)}
        assert prepack.prepacked(layer.weight, low).is_mkldnn
        assert max_rel_error(got.double(), ref) <= (REDUCED_VS_FP32['bf16'] if dtype == 'bf16' else FP32_PARITY)
    finally:
        prepack.release_prepacked(layer)


def test_an_updated_weight_is_packed_again():
    """In-place updates through the parameter (``copy_``, ``load_state_dict``) change its version: the next call packs
    the new values, so the output is the plain ops' on the new weights, never the old packed ones."""
    layer, x, r = _operands()
    new, _, _ = _operands(seed=5)
    prepack.prepack_weights(layer)
    try:
        with torch.inference_mode():
            before = linear(x, layer)
        with torch.no_grad():
            layer.load_state_dict(new.state_dict())
        with torch.inference_mode():
            after = linear(x, layer)
            ref = nn.functional.linear(x.double(), new.weight.double(), new.bias.double())
        assert max_rel_error(after.double(), ref) <= FP32_PARITY and max_rel_error(before.double(), ref) > 0.1
        with torch.no_grad():
            layer.weight.mul_(2)
        with torch.inference_mode():
            doubled = linear(x, layer)
            ref = nn.functional.linear(x.double(), 2 * new.weight.double(), new.bias.double())
        assert max_rel_error(doubled.double(), ref) <= FP32_PARITY
    finally:
        prepack.release_prepacked(layer)


def test_training_and_unfrozen_weights_read_the_parameter():
    """A weight never passed to ``prepack_weights`` has no packed copy, and a training forward of a frozen one runs
    the plain ops: its gradients are ``F.linear``'s."""
    layer, x, _ = _operands()
    assert prepack.prepacked(layer.weight, torch.float32) is None
    prepack.prepack_weights(layer)
    try:
        x.requires_grad_(True)
        linear(x, layer).sum().backward()
        assert not _packed_keys(layer)
        ref = x.detach().double().requires_grad_(True)
        ref_w = layer.weight.detach().double().requires_grad_(True)
        nn.functional.linear(ref, ref_w, layer.bias.detach().double()).sum().backward()
        assert max_rel_error(layer.weight.grad.double(), ref_w.grad) <= FP32_PARITY
        assert max_rel_error(x.grad.double(), ref.grad) <= FP32_PARITY
    finally:
        prepack.release_prepacked(layer)


def test_packed_copies_are_released():
    """``release_prepacked`` drops a module's copies and marks; a parameter that is garbage-collected takes its own
    with it."""
    layer, x, _ = _operands()
    prepack.prepack_weights(layer)
    with torch.inference_mode():
        linear(x, layer)
    assert _packed_keys(layer)
    prepack.release_prepacked(layer)
    assert not _packed_keys(layer) and id(layer.weight) not in prepack._FROZEN
    prepack.prepack_weights(layer)
    with torch.inference_mode():
        linear(x, layer)
    key = id(layer.weight)
    assert any(k[0] == key for k in prepack._PACKED)
    del layer
    gc.collect()
    assert key not in prepack._FROZEN and not any(k[0] == key for k in prepack._PACKED)


@pytest.mark.numeric
def test_a_prepacked_backbone_gives_the_same_outputs():
    """A Swin backbone with prepacked weights: the outputs of its unpacked copy within fp32 rounding, the state dict
    the same tensors, and the model still copies and saves (the packed copies live outside the parameters)."""
    model = tiny_backbone('swin').eval()
    plain = copy.deepcopy(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(1, 3, 61, 83, generator=torch.Generator().manual_seed(2))
    prepack.prepack_weights(model)
    try:
        with torch.inference_mode():
            got, ref = model(x), plain(x)
        assert _packed_keys(model)
        assert all(max_rel_error(a, b) <= FP32_PARITY for a, b in zip(got, ref))
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        torch.save(copy.deepcopy(model).state_dict(), io.BytesIO())
    finally:
        prepack.release_prepacked(model)


@pytest.mark.parametrize('layout', ['channels_last', 'contiguous'])
@pytest.mark.parametrize('case', ['gelu', 'add'])
def test_pointwise_convolutions_compute_the_convolution(case, layout):
    """A dense 1x1 convolution on a channels_last map runs as oneDNN's linear over the pixels (its weight prepacked
    once frozen); on another layout as oneDNN's convolution. Either way: ``F.conv2d`` (+ GELU / + residual) in
    float64 within fp32 rounding, in the input's layout, NaN in one pixel giving NaN in that pixel only."""
    from mmplugin.models.layers.fusion import conv_act, conv_add
    g = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(24, 40, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(40, 24, 1, 1, generator=g) * 0.2)
        conv.bias.copy_(torch.randn(40, generator=g))
    fmt = torch.channels_last if layout == 'channels_last' else torch.contiguous_format
    x = torch.randn(2, 24, 7, 9, generator=g).contiguous(memory_format=fmt)
    r = torch.randn(2, 40, 7, 9, generator=g).contiguous(memory_format=fmt)
    ref = nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double())
    ref = nn.functional.gelu(ref) if case == 'gelu' else ref + r.double()
    prepack.prepack_weights(conv)
    try:
        with torch.inference_mode():
            got = conv_act(x, conv, 'gelu') if case == 'gelu' else conv_add(x, conv, r)
            assert max_rel_error(got.double(), ref) <= FP32_PARITY
            assert got.is_contiguous(memory_format=fmt)
            assert bool(_packed_keys(conv)) == (layout == 'channels_last')
            x[1, :, 3, 4] = float('nan')
            got = conv_act(x, conv, 'gelu') if case == 'gelu' else conv_add(x, conv, r)
        assert got[1, :, 3, 4].isnan().all() and got.isnan().sum() == got.shape[1]
    finally:
        prepack.release_prepacked(conv)


def test_new_storage_is_packed_again():
    """Values given to a parameter without an in-place write through it (``module.half().float()``, ``param.data =
    ...``) leave its version counter as it was: the copy is tied to the storage it was packed from (which it keeps
    alive, so new values never arrive at the same address), and the next call packs the new values."""
    layer, x, _ = _operands()
    prepack.prepack_weights(layer)
    try:
        for change in (lambda: layer.half().float(), lambda: setattr(layer.weight, 'data', layer.weight.data * 3)):
            with torch.inference_mode():
                linear(x, layer)
            change()
            with torch.inference_mode():
                got = linear(x, layer)
            ref = nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
            assert max_rel_error(got.double(), ref) <= FP32_PARITY
    finally:
        prepack.release_prepacked(layer)


def test_parameters_made_in_inference_mode_are_not_packed():
    """A parameter created under ``torch.inference_mode()`` keeps no version counter, so changes to it could not be
    seen: it is never packed, and the fused op reads it as it is."""
    with torch.inference_mode():
        layer, x, _ = _operands()
    prepack.prepack_weights(layer)
    try:
        with torch.inference_mode():
            got = linear(x, layer)
        assert prepack.prepacked(layer.weight, torch.float32) is None and not _packed_keys(layer)
        ref = nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
        assert max_rel_error(got.double(), ref) <= FP32_PARITY
    finally:
        prepack.release_prepacked(layer)


def test_a_broadcast_residual_keeps_the_convolution():
    """``conv_add`` with a residual that broadcasts (one value per channel) adds it as ``conv(x) + r`` does."""
    from mmplugin.models.layers.fusion import conv_add
    conv = nn.Conv2d(8, 6, 1)
    x = torch.randn(2, 8, 5, 7).contiguous(memory_format=torch.channels_last)
    r = torch.randn(1, 6, 1, 1)
    with torch.inference_mode():
        got = conv_add(x, conv, r)
    ref = nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double()) + r.double()
    assert got.shape == ref.shape and max_rel_error(got.double(), ref) <= FP32_PARITY
