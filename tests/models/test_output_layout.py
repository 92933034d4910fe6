"""The returned maps' layout: ``contiguous_nchw`` is ``x.contiguous()`` (same values bit for bit, NCHW memory, NaN
and Inf where they were), by a transpose (the plugin's kernel, or ATen's blocked copy) for channels_last CPU maps
and by ``x.contiguous()`` itself everywhere else; under autograd its gradient comes back channels_last."""
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


def test_takes_the_blocked_transpose_only_for_channels_last_maps(monkeypatch):
    """An NCHW map comes back as it is; while traced the result is ``x.contiguous()``. The transpose kernel serves
    every thread count; without it (no compiler), ATen's blocked copy serves up to two threads and the strided copy
    beyond, where it is the faster."""
    from mmplugin.ops import transpose
    x = _channels_last(2, 96, 40, 40)
    copies = _strided_copies(monkeypatch)
    kernel_calls = []
    plain_kernel = transpose.transpose_into

    def spy(*args):
        kernel_calls.append(args[2:])
        return plain_kernel(*args)
    monkeypatch.setattr(transpose, 'transpose_into', spy)
    with torch.no_grad(), _threads(2):
        contiguous_nchw(x)
        plain = x.contiguous()
        assert contiguous_nchw(plain) is plain
    assert len(copies) == 1  # the reference above only
    with torch.no_grad(), _threads(4):
        assert torch.equal(contiguous_nchw(x), plain)
    assert len(copies) == 1 and kernel_calls == [(2, 1600, 96)] * 2 and transpose.available()
    monkeypatch.setattr(transpose, 'available', lambda: False)
    monkeypatch.setattr(transpose, 'transpose_into', lambda *args: False)
    with torch.no_grad(), _threads(2):
        assert torch.equal(contiguous_nchw(x), plain)
    assert len(copies) == 1  # ATen's blocked copy
    with torch.no_grad(), _threads(4):
        assert torch.equal(contiguous_nchw(x), plain)
    assert len(copies) == 2  # the strided copy
    with _threads(2):
        traced = torch.jit.trace(contiguous_nchw, (x,))
    assert any(n.kind() == 'aten::contiguous' for n in traced.graph.nodes())
    assert torch.equal(traced(x), plain)


@pytest.mark.parametrize('threads', [2, 4])
@pytest.mark.parametrize('shape', [(2, 96, 40, 40), (1, 5, 3, 7)])
def test_gradient_comes_back_channels_last(shape, threads):
    """Under autograd the values are ``x.contiguous()``'s and the gradient equals the incoming one bit for bit, in
    channels_last memory like ``x`` (an NCHW gradient would put the backbone's whole backward on mixed layouts);
    contiguous, expanded and channels_last incoming gradients alike."""
    x = _channels_last(*shape).requires_grad_(True)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    for incoming in (g, torch.tensor(0.25).expand(shape), g.contiguous(memory_format=torch.channels_last)):
        with _threads(threads):
            out = contiguous_nchw(x)
            assert out.is_contiguous() and torch.equal(out, x.detach().contiguous())
            (grad,) = torch.autograd.grad(out, x, incoming)
        assert grad.is_contiguous(memory_format=torch.channels_last) and torch.equal(grad, incoming)
    nchw = x.detach().contiguous().requires_grad_(True)  # already NCHW: the plain path, gradient as it comes
    assert torch.autograd.grad(contiguous_nchw(nchw), nchw, g)[0].is_contiguous()


def test_batched_and_forward_mode_derivatives_are_the_copys():
    """Batched gradients (``is_grads_batched``, a vectorised jacobian) come back as they arrive, and forward-mode AD
    takes the copy's tangent: both equal what ``x.contiguous()`` gives."""
    import torch.autograd.forward_ad as fwAD
    x = _channels_last(1, 3, 4, 5).requires_grad_(True)
    gs = torch.randn(2, 1, 3, 4, 5, generator=torch.Generator().manual_seed(4))
    (got,) = torch.autograd.grad(contiguous_nchw(x), x, gs, is_grads_batched=True)
    assert torch.equal(got, gs)
    jac = torch.autograd.functional.jacobian(contiguous_nchw, x.detach(), vectorize=True)
    assert torch.equal(jac, torch.autograd.functional.jacobian(lambda t: t.contiguous(), x.detach()))
    tangent = _channels_last(1, 3, 4, 5) * 2
    with fwAD.dual_level():
        out = contiguous_nchw(fwAD.make_dual(x, tangent))
        assert torch.equal(fwAD.unpack_dual(out).tangent, tangent.contiguous())


def test_swiftformer_backward_runs_on_one_layout():
    """A SwiftFormer training backward hands every BatchNorm and convolution backward a gradient in its input's
    memory format (mixed formats take PyTorch's slow paths), and the parameter gradients equal those of the
    plain ``x.contiguous()`` outputs (float64, where summation order cannot show)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from mmplugin.models.backbones import base
    from mmplugin.models.backbones.base import get_family

    def fmt(t):
        return 'cl' if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous() else 'other'

    class Formats(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.pairs = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.native_batch_norm_backward.default,
                        torch.ops.aten.convolution_backward.default) and args[1].shape[2] * args[1].shape[3] > 1:
                self.pairs.append((fmt(args[0]), fmt(args[1])))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    m = get_family('swiftformer')('xs').train().double()
    x = torch.randn(2, 3, 96, 128, dtype=torch.float64)
    weights = None
    grads = []
    for patched in (False, True):
        with pytest.MonkeyPatch.context() as patch:
            if patched:
                patch.setattr(base, 'contiguous_nchw', lambda t: t.contiguous())
            outs = m(x)
            weights = weights or [torch.randn_like(o) for o in outs]
            mode = Formats()
            with mode:
                grads.append(torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)),
                                                 list(m.parameters())))
        if not patched:
            assert len(mode.pairs) > 20 and all(g == i == 'cl' for g, i in mode.pairs)
        else:  # the plain copy's NCHW gradients meet channels_last inputs: what the check above would catch
            assert any(g != i for g, i in mode.pairs)
    # against the largest gradient of the model: a conv bias before a BatchNorm has an exact gradient of 0, so
    # both paths give float64 rounding noise there (~1e-13); summation order alone moves the rest by ~1e-16 x terms
    scale = max(b.abs().max().item() for b in grads[1])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11 * scale)


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
