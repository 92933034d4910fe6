"""NaN and Inf in the input propagate exactly as in the reference formulations, in every mode: eval, train, SwiftFormer
after ``switch_to_deploy()``, bf16 and fp16 autocast, and whole models cast to fp16 / bf16. The NaN / Inf masks of
every output are compared; in bf16 also against the reference computed in fp32, so a kernel that leaks non-finite
values into neighbouring outputs under reduced precision (oneDNN's native-bf16 convolution does on AVX512-BF16 CPUs)
fails the test on the machine that has it, whatever the reference does under the same kernel."""
from __future__ import annotations

import pytest
import torch
from conftest import randomize_

from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2
from mmplugin.models.backbones.swiftformer import convert_swiftformer
from mmplugin.reference.swiftformer import ReferenceSwiftFormer
from mmplugin.reference.swin import ReferenceSwin

pytestmark = pytest.mark.numeric

SWIN_ARCH = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4])
SF_ARCH = dict(depths=[2, 2, 2, 2], embed_dims=[16, 16, 32, 32])


def _pair(family: str):
    if family == 'swiftformer':
        ref = randomize_(ReferenceSwiftFormer(SF_ARCH['depths'], SF_ARCH['embed_dims']), seed=1)
        model = SwiftFormer(SF_ARCH)
        model.load_state_dict(convert_swiftformer(ref.state_dict())[0])
        return model, ref
    cls = SwinTransformerV2 if family == 'swinv2' else SwinTransformer
    model = randomize_(cls(SWIN_ARCH, window_size=4, drop_path_rate=0.0), seed=1)
    ref = ReferenceSwin(SWIN_ARCH['embed_dims'], SWIN_ARCH['depths'], SWIN_ARCH['num_heads'], 4, family == 'swinv2')
    ref.load_state_dict(model.state_dict())
    return model, ref


def _input(kind: str) -> torch.Tensor:
    x = torch.randn(2, 3, 72, 88)
    if kind in ('nan', 'both'):
        x[0, 1, 5, 7] = float('nan')  # one pixel of the first image: the second must stay clean
    if kind in ('inf', 'both'):
        x[0, 0, 60, 80] = float('inf')
    return x


def _masks(outs):
    return [(torch.isnan(o.float()), torch.isinf(o.float())) for o in outs]


LOW = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp16-model': torch.float16, 'bf16-model': torch.bfloat16}


@pytest.mark.parametrize('kind', ['nan', 'inf', 'both'])
@pytest.mark.parametrize('mode', ['eval', 'train', 'deploy', 'bf16', 'fp16', 'fp16-model', 'bf16-model'])
@pytest.mark.parametrize('family', ['swiftformer', 'swin', 'swinv2'])
def test_nonfinite_inputs_propagate_like_the_reference(family, mode, kind):
    """Reduced precision (autocast, or the whole model cast with ``.to(dtype)``) is held to the reference in fp32:
    the formulations themselves differ there on the CPU (the reference normalises Swin V2's zero padding tokens in
    fp16, which gives NaN for every query of the window; GPU autocast normalises in fp32, as the plugin does)."""
    if mode == 'deploy' and family != 'swiftformer':
        pytest.skip('switch_to_deploy() is SwiftFormer-only')
    model, ref = _pair(family)
    train = mode == 'train'
    model.train(train)
    ref.train(train)
    if mode == 'deploy':
        model.switch_to_deploy()
    x = _input(kind)
    low = LOW.get(mode)
    if mode.endswith('-model'):
        model.to(low)
    ctx = torch.autocast('cpu', dtype=low, enabled=mode in ('bf16', 'fp16'))
    with torch.no_grad(), ctx:
        got = model(x.to(low) if mode.endswith('-model') else x)
        want = ref(x) if mode in ('eval', 'train', 'deploy', 'bf16') else None
    if low is not None:
        with torch.no_grad():
            want32 = ref(x)
        for (gn, gi), (wn, wi) in zip(_masks(got), _masks(want32)):
            assert torch.equal(gn, wn), f'NaN mask differs from fp32: {int(gn.sum())} vs {int(wn.sum())}'
            assert torch.equal(gi, wi), f'Inf mask differs from fp32: {int(gi.sum())} vs {int(wi.sum())}'
        want = want if want is not None else want32
    nonfinite = 0
    for (gn, gi), (wn, wi) in zip(_masks(got), _masks(want)):
        assert torch.equal(gn, wn), f'NaN mask differs: {int(gn.sum())} vs reference {int(wn.sum())}'
        assert torch.equal(gi, wi), f'Inf mask differs: {int(gi.sum())} vs reference {int(wi.sum())}'
        nonfinite += int(wn.sum() + wi.sum())
        if mode != 'train':  # batch statistics mix the images in train mode; otherwise image 2 stays clean
            assert not (gn[1].any() or gi[1].any())
    assert nonfinite > 0, 'the reference produced no non-finite value: the check would be vacuous'


def test_patch_gemm_equals_the_strided_convolution():
    """The patch-embedding GEMM is the kernel = stride convolution (float64: rounding ~1e-16, bound 1e-12), also
    for non-square maps and a bias-free projection; a map not divisible by the patch is refused."""
    from mmplugin.models.backbones.swin.patchify import patch_embed, patchify_linear
    x = torch.randn(2, 3, 24, 40, dtype=torch.float64)
    for bias in (True, False):
        conv = torch.nn.Conv2d(3, 8, 4, 4, bias=bias).double()
        want = conv(x).permute(0, 2, 3, 1)
        got = patchify_linear(x, conv.weight, conv.bias)
        assert got.shape == want.shape == (2, 6, 10, 8)
        assert (got - want).abs().max().item() <= 1e-12 * want.abs().max().item()
        assert torch.equal(patch_embed(x, conv), conv(x.contiguous(memory_format=torch.channels_last)).permute(
            0, 2, 3, 1))  # fp64 / fp32 without autocast: the convolution itself
    with pytest.raises(ValueError, match='divisible'):
        patchify_linear(x[..., :23, :], conv.weight, conv.bias)
    # under autocast the GEMM runs: an Inf pixel makes exactly its own token non-finite, in every channel
    conv = torch.nn.Conv2d(3, 8, 4, 4).eval()
    x = torch.randn(1, 3, 24, 40)
    x[0, 0, 13, 22] = float('inf')
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = patch_embed(x, conv).float()
    bad = ~torch.isfinite(out)
    assert bad[0, 3, 5].all() and int(bad.sum()) == 8
