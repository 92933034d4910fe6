"""NaN and Inf in the input propagate exactly as in the reference formulations, in every mode: eval, train,
SwiftFormer after ``switch_to_deploy()``, and bf16 autocast. The NaN / Inf masks of every output are compared."""
from __future__ import annotations

import pytest
import torch
from conftest import randomize_

from mmplugin.converters import convert_swiftformer
from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2
from mmplugin.reference.swiftformer import ReferenceSwiftFormer
from mmplugin.reference.swin import ReferenceSwin

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


@pytest.mark.parametrize('kind', ['nan', 'inf', 'both'])
@pytest.mark.parametrize('mode', ['eval', 'train', 'deploy', 'bf16'])
@pytest.mark.parametrize('family', ['swiftformer', 'swin', 'swinv2'])
def test_nonfinite_inputs_propagate_like_the_reference(family, mode, kind):
    if mode == 'deploy' and family != 'swiftformer':
        pytest.skip('switch_to_deploy() is SwiftFormer-only')
    model, ref = _pair(family)
    train = mode == 'train'
    model.train(train)
    ref.train(train)
    if mode == 'deploy':
        model.switch_to_deploy()
    x = _input(kind)
    ctx = torch.autocast('cpu', dtype=torch.bfloat16, enabled=mode == 'bf16')
    with torch.no_grad(), ctx:
        got, want = model(x), ref(x)
    nonfinite = 0
    for (gn, gi), (wn, wi) in zip(_masks(got), _masks(want)):
        assert torch.equal(gn, wn), f'NaN mask differs: {int(gn.sum())} vs reference {int(wn.sum())}'
        assert torch.equal(gi, wi), f'Inf mask differs: {int(gi.sum())} vs reference {int(wi.sum())}'
        nonfinite += int(wn.sum() + wi.sum())
        if mode != 'train':  # batch statistics mix the images in train mode; otherwise image 2 stays clean
            assert not (gn[1].any() or gi[1].any())
    assert nonfinite > 0, 'the reference produced no non-finite value: the check would be vacuous'
