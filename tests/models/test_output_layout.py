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


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize('shape', [(1, 96, 50, 76), (2, 48, 61, 67), (3, 1, 70, 70), (2, 5, 3, 7), (1, 768, 4, 3)])
def test_equals_contiguous_bit_for_bit(shape, dtype):
    x = _channels_last(*shape, dtype=dtype)
    x[0, 0, 1, 2], x[-1, -1, -1, -1] = float('nan'), float('-inf')
    with torch.no_grad():
        out = contiguous_nchw(x)
    ref = x.contiguous()
    assert out.shape == ref.shape and out.is_contiguous() and out.dtype == dtype
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(0.5), ref.nan_to_num(0.5))


def test_takes_the_blocked_transpose_only_for_channels_last_inference():
    """The transpose writes a fresh tensor; an NCHW map comes back as it is, and under autograd or while traced the
    result is ``x.contiguous()``, gradient included."""
    x = _channels_last(2, 96, 40, 40)
    with torch.no_grad():
        assert contiguous_nchw(x).data_ptr() != x.data_ptr()
        plain = x.contiguous()
        assert contiguous_nchw(plain) is plain
    w = x.clone().requires_grad_(True)
    out = contiguous_nchw(w)
    assert out.grad_fn is not None and torch.equal(out, x.contiguous())
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(w.grad, g)
    traced = torch.jit.trace(contiguous_nchw, (x,))
    assert any(n.kind() == 'aten::contiguous' for n in traced.graph.nodes())
    assert torch.equal(traced(x), x.contiguous())


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
        with torch.no_grad():
            outs = m(x)
            with monkeypatch.context() as patch:
                for module in (base, swin_model):
                    patch.setattr(module, 'contiguous_nchw', lambda t: t.contiguous())
                refs = m(x)
        assert len(outs) == len(refs) == 4
        assert all(o.is_contiguous() and torch.equal(o, r) for o, r in zip(outs, refs))
