"""The recomputing training ops (mmplugin.models.layers.recompute): their gradients (gradcheck in float64), a forward
equal to the plain ops', Swin V1 / V2 training gradients equal the official formulation's with them in use, and the
saved tensors they remove (counted in bytes, against mmdet's Swin with the same configuration)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FP64_PARITY, randomize_, rel_err

from mmplugin.models.backbones import SwinTransformer, SwinTransformerV2
from mmplugin.models.layers import recompute
from mmplugin.reference.swin import ReferenceSwin

pytestmark = pytest.mark.numeric

SMALL = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])


def _f64(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()


@pytest.mark.parametrize('bias', [True, False])
def test_gelu_linear_gradients(bias):
    h, w = _f64(2, 5, 6, seed=0), _f64(4, 6, seed=1)
    b = _f64(4, seed=2) if bias else None
    inputs = (h, w, b) if bias else (h, w)
    assert torch.autograd.gradcheck(lambda *a: recompute._GeluLinear.apply(*a, *([None] * (3 - len(a)))), inputs)


@pytest.mark.parametrize('bias', [True, False])
def test_layer_norm_linear_gradients(bias):
    x, gamma, beta, w = _f64(2, 5, 6, seed=0), _f64(6, seed=1), _f64(6, seed=2), _f64(4, 6, seed=3)
    b = _f64(4, seed=4) if bias else None
    assert torch.autograd.gradcheck(lambda x, g, be, w, *b: recompute._LayerNormLinear.apply(x, g, be, 1e-5, w, *b),
                                    (x, gamma, beta, w, *([b] if bias else [None])))


@pytest.mark.parametrize('windows_in_bias', [3, 1])  # a shift mask per window, or the position bias alone
def test_window_attention_gradients(windows_in_bias):
    b, nw, heads, n, d = 2, 3, 2, 4, 3
    q, k, v = (_f64(b * nw, heads, n, d, seed=s) for s in range(3))
    bias = _f64(windows_in_bias, heads, n, n, seed=3)
    assert torch.autograd.gradcheck(lambda *a: recompute._WindowAttention.apply(*a, b, 0.7), (q, k, v, bias))


def test_forward_is_the_plain_ops_bit_for_bit():
    """The same ATen calls in the same order: equal outputs, not merely close ones."""
    torch.manual_seed(0)
    h, w, bb = torch.randn(3, 50, 64, requires_grad=True), torch.randn(16, 64), torch.randn(16)
    assert torch.equal(recompute.gelu_linear(h, w, bb), F.linear(F.gelu(h), w, bb))
    norm = torch.nn.LayerNorm(64)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    got = recompute.layer_norm_linear(h, norm, w, bb)
    assert got.grad_fn.name().endswith('_LayerNormLinearBackward') and torch.equal(got, F.linear(norm(h), w, bb))
    b, nw, heads, n, d = 2, 4, 3, 49, 32
    q, k, v = (torch.randn(b * nw, heads, n, d, requires_grad=True) for _ in range(3))
    bias = torch.randn(nw, heads, n, n, requires_grad=True)
    got = recompute.window_softmax_attention(q, k, v, bias, b, d**-0.5)
    logits = (q * d**-0.5) @ k.transpose(-2, -1)
    want = (logits.view(b, nw, heads, n, n) + bias).view(b * nw, heads, n, n).softmax(-1) @ v
    assert got.grad_fn.name().endswith('_WindowAttentionBackward') and torch.equal(got, want)


def test_applies_only_to_eager_cpu_training():
    x = torch.randn(4, requires_grad=True)
    assert recompute.recompute_applies(x) and recompute.recompute_applies(x.double())
    assert not recompute.recompute_applies(x.half())
    with torch.no_grad():
        assert not recompute.recompute_applies(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not recompute.recompute_applies(x)


@pytest.mark.parametrize('v2', [False, True], ids=['v1', 'v2'])
def test_training_gradients_equal_the_official_formulation(v2, monkeypatch):
    """Forward + backward at a padded, shifted size in float64 with the recomputing ops in every block (V1's
    pre-norm MLP also recomputes its LayerNorm): every parameter's gradient equals the official formulation's
    (autograd through the plain ops) to rounding."""
    used = {'attention': 0, 'mlp': 0, 'norm': 0}
    for cls, key in ((recompute._WindowAttention, 'attention'), (recompute._GeluLinear, 'mlp'),
                     (recompute._LayerNormLinear, 'norm')):
        fwd = cls.forward
        monkeypatch.setattr(cls, 'forward', staticmethod(
            lambda *a, _f=fwd, _k=key: used.__setitem__(_k, used[_k] + 1) or _f(*a)))
    cls = SwinTransformerV2 if v2 else SwinTransformer
    model = randomize_(cls(SMALL, window_size=7, drop_path_rate=0.0), seed=5).double().train()
    ref = ReferenceSwin(SMALL['embed_dims'], SMALL['depths'], SMALL['num_heads'], 7, v2, 0).double().train()
    ref.load_state_dict(model.state_dict(), strict=True)
    x = torch.randn(2, 3, 71, 90, dtype=torch.float64)
    weights = [torch.randn(o.shape, dtype=torch.float64) for o in ref(x)]
    for m in (model, ref):
        sum((o * w).sum() for o, w in zip(m(x), weights)).backward()
    blocks = sum(SMALL['depths'])
    assert used == {'attention': blocks, 'mlp': blocks, 'norm': 0 if v2 else blocks}
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert rel_err(p.grad, want[name].grad) < FP64_PARITY, name


def _saved_bytes(model, x) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of ``model(x)``."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(storages.values())


def _recomputed_bytes(arch, b, hw, ws=7) -> int:
    """fp32 bytes of the three tensors per V1 block that autograd through the plain ops must keep and the
    recomputing ops do not: the MLP's normalised input (C per token), GELU's output (4C) and the attention
    probabilities (heads * N per token of the map padded to whole windows)."""
    h, w = -(-hw[0] // 4), -(-hw[1] // 4)
    total = 0
    for i, depth in enumerate(arch['depths']):
        c, heads = arch['embed_dims'] * 2**i, arch['num_heads'][i]
        padded = b * -(-h // ws) * ws * -(-w // ws) * ws
        total += depth * 4 * (5 * c * b * h * w + heads * ws * ws * padded)
        h, w = -(-h // 2), -(-w // 2)
    return total


@pytest.mark.parametrize('hw', [(112, 112), (71, 90)])
def test_training_keeps_less_than_mmdet_swin(hw):
    """mmdet's Swin keeps the MLP's normalised input, GELU's output and the attention probabilities of every
    block; the recomputing ops keep none of them, and keep q, k, v once in place of the contiguous copies the plain
    batched products keep (the same size, 3C per token). So the plugin keeps at least 90% of those tensors' bytes
    less than mmdet (0% without recomputation, where both keep the same bytes)."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    torch.manual_seed(0)
    ours = SwinTransformer(SMALL, drop_path_rate=0.0).train()
    theirs = MMDetSwin(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), drop_path_rate=0.0)
    theirs.train()  # mmdet's SwinTransformer.train() returns None
    x = torch.randn(2, 3, *hw)
    removed = _saved_bytes(theirs, x) - _saved_bytes(ours, x)
    assert removed >= 0.9 * _recomputed_bytes(SMALL, 2, hw), (removed, _recomputed_bytes(SMALL, 2, hw))
