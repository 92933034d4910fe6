"""The returned maps' layout: ``contiguous_nchw`` is ``x.contiguous()`` (same values bit for bit, NCHW memory, NaN
and Inf where they were), by its blocked transpose for channels_last CPU maps at inference and by
``x.contiguous()`` itself everywhere else."""
from __future__ import annotations

import pytest
import torch

from mmplugin.models.layers.layout import contiguous_nchw


def _channels_last(b, c, h, w, dtype=torch.float32):
    g = torch.Generator().manual_seed(b * 1000 + c)
    return torch.randn(b, h, w, c, generator=g).to(dtype).permute(0, 3, 1, 2)  # NCHW shape, NHWC memory


def _strided_copies(monkeypatch):
    """Records every ``Tensor.contiguous`` call that copies (the strided path)."""
    calls, plain = [], torch.Tensor.contiguous

    def spy(t, *args, **kwargs):
        if not t.is_contiguous(*args, **kwargs):
            calls.append(tuple(t.shape))
        return plain(t, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, 'contiguous', spy)
    return calls


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize('shape', [(1, 96, 50, 76), (2, 48, 61, 67), (1, 768, 4, 3), (2, 5, 3, 7), (3, 1, 70, 70)])
def test_equals_contiguous_bit_for_bit(shape, dtype, monkeypatch):
    """Channels_last maps of at least 3600 values per image take the blocked transpose (no strided copy); smaller ones
    and a single channel (already contiguous) do not. Either way the values are ``x.contiguous()``'s."""
    x = _channels_last(*shape, dtype=dtype)
    x[0, 0, 1, 2], x[-1, -1, -1, -1] = float('nan'), float('-inf')
    ref = x.contiguous()
    copies = _strided_copies(monkeypatch)
    with torch.no_grad(), _threads(2):
        out = contiguous_nchw(x)
    blocked = shape[1] > 1 and shape[1] * shape[2] * shape[3] >= 3600
    assert copies == ([] if blocked else [shape] * (shape[1] > 1))
    assert out.shape == ref.shape and out.is_contiguous() and out.dtype == dtype
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(0.5), ref.nan_to_num(0.5))


class _threads:
    def __init__(self, n):
        self.n, self.before = n, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def test_takes_the_blocked_transpose_only_for_channels_last_inference(monkeypatch):
    """An NCHW map comes back as it is; under autograd, while traced, or with more threads than the blocked copy
    pays off at, the result is ``x.contiguous()`` (the strided copy), gradient included."""
    x = _channels_last(2, 96, 40, 40)
    copies = _strided_copies(monkeypatch)
    with torch.no_grad(), _threads(2):
        contiguous_nchw(x)
        plain = x.contiguous()
        assert contiguous_nchw(plain) is plain
    assert len(copies) == 1  # the reference above only
    with torch.no_grad(), _threads(4):
        assert torch.equal(contiguous_nchw(x), plain)
    assert len(copies) == 2
    w = x.clone().requires_grad_(True)
    with _threads(2):
        out = contiguous_nchw(w)
    assert len(copies) == 3 and out.grad_fn is not None and torch.equal(out, plain)
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(w.grad, g)
    with _threads(2):
        traced = torch.jit.trace(contiguous_nchw, (x,))
    assert any(n.kind() == 'aten::contiguous' for n in traced.graph.nodes())
    assert torch.equal(traced(x), plain)


def test_backbone_outputs_equal_the_strided_copy(monkeypatch):
    """Swin and SwiftFormer at inference return contiguous NCHW maps equal bit for bit to ``.contiguous()`` of
    their channels_last values (the form before the blocked transpose)."""
    from mmplugin.models.backbones import base
    from mmplugin.models.backbones.base import get_family
    from mmplugin.models.backbones.swin import model as swin_model
    torch.manual_seed(0)
    x = torch.randn(1, 3, 256, 320)
    for family, arch in (('swin', 'tiny'), ('swiftformer', 'xs')):
        m = get_family(family)(arch).eval()
        with torch.no_grad(), _threads(2):
            outs = m(x)
            with monkeypatch.context() as patch:
                for module in (base, swin_model):
                    patch.setattr(module, 'contiguous_nchw', lambda t: t.contiguous())
                refs = m(x)
        assert len(outs) == len(refs) == 4
        assert all(o.is_contiguous() and torch.equal(o, r) for o, r in zip(outs, refs))
