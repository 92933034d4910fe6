"""Layer-wise learning-rate decay for every family: the parameter groups it produces, and a clear refusal for
backbones that are not the plugin's."""
from __future__ import annotations

import pytest
from mmengine.optim import build_optim_wrapper
from torch import nn

import mmplugin  # noqa: F401
from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2


class _Model(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(4, 2)


def _lrs(backbone, rate=0.5):
    model = _Model(backbone)
    wrapper = build_optim_wrapper(model, dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0),
                                              constructor='mmplugin.LayerDecayOptimWrapperConstructor',
                                              paramwise_cfg=dict(layer_decay_rate=rate)))
    by_id = {id(p): g['lr'] for g in wrapper.optimizer.param_groups for p in g['params']}
    return {n: by_id[id(p)] for n, p in model.named_parameters()}


def test_swiftformer_groups():
    # XS depths [3, 3, 6, 4] (16 blocks): stem 0, blocks 1..16, head 17
    lr = _lrs(SwiftFormer('xs'))
    want = {'backbone.stem.0.weight': 17, 'backbone.stages.0.blocks.0.dwconv.weight': 16,
            'backbone.stages.0.blocks.2.attn.w_g': 14, 'backbone.norm0.weight': 14,
            'backbone.stages.1.downsample.proj.weight': 13, 'backbone.stages.1.blocks.0.pwconv1.weight': 13,
            'backbone.stages.3.blocks.3.linear.fc2.weight': 1, 'backbone.norm3.bias': 1, 'head.weight': 0}
    for n, power in want.items():
        assert lr[n] == 0.5**power, n
    assert len(set(lr.values())) == 18  # every depth 0..17 is used


@pytest.mark.parametrize('cls', [SwinTransformer, SwinTransformerV2])
def test_swin_groups(cls):
    arch = dict(embed_dims=32, depths=[2, 2, 4, 2], num_heads=[1, 2, 4, 8])  # 10 blocks, head at depth 11
    lr = _lrs(cls(arch))
    want = {'backbone.patch_embed.proj.weight': 11, 'backbone.layers.0.blocks.0.norm1.weight': 10,
            'backbone.layers.1.downsample.reduction.weight': 7, 'backbone.layers.2.blocks.3.mlp.fc1.bias': 3,
            'backbone.norm2.weight': 3, 'backbone.layers.3.blocks.0.attn.proj.weight': 2, 'head.bias': 0}
    for n, power in want.items():
        assert lr[n] == pytest.approx(0.5**power), n


def test_refused_for_other_backbones():
    from mmdet.models.backbones import ResNet
    with pytest.raises(ValueError, match='layer_decay_rate needs a model whose backbone is a plugin backbone'):
        _lrs(ResNet(18))
    with pytest.raises(ValueError, match=r'layer_decay_rate must be in \(0, 1\]'):
        _lrs(SwiftFormer('xs'), rate=1.5)
