"""The implementations a user would otherwise pick, per backbone family, built with the plugin model's weights
where the layouts allow: what ``tools/benchmark.py`` and ``tools/speed_table.py`` time the plugin against.

:data:`PEERS` maps a family name to a function ``(arch, model) -> {name: module}``; the first entry is the
baseline of the printed ratios. A family without an entry (e.g. one registered outside this repository) is timed
alone; :func:`register_peers` adds one.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ['PEERS', 'register_peers', 'build_peers', 'benchmark_models']


def swiftformer_peers(arch: str, model: nn.Module) -> dict[str, nn.Module]:
    """The official formulation (its random weights are loaded into ``model``), the plugin after
    ``switch_to_deploy()`` with the same weights, and mmdet's ResNet-50 / ResNet-18 (other networks)."""
    from mmdet.models.backbones import ResNet

    from mmplugin.models.backbones.swiftformer.converter import convert_swiftformer
    from mmplugin.reference.swiftformer import ReferenceSwiftFormer
    cls = type(model)
    s = cls.resolve_arch(arch)
    ref = ReferenceSwiftFormer(s['depths'], s['embed_dims'])
    model.load_state_dict(convert_swiftformer(ref.state_dict())[0])
    deploy = cls(arch)
    deploy.load_state_dict(model.state_dict())
    deploy.eval().switch_to_deploy()
    return {'official': ref, 'mmplugin-deploy': deploy, 'mmdet-R50': ResNet(50), 'mmdet-R18': ResNet(18)}


def swin_peers(arch: str, model: nn.Module) -> dict[str, nn.Module]:
    """mmdet's ``SwinTransformer`` with ``model``'s weights (its derived ``relative_position_index`` buffers are its
    own)."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin

    from mmplugin.models.backbones.swin.converter import plugin_to_mmdet_swin
    theirs = MMDetSwin(embed_dims=model.embed_dims, depths=model.depths, num_heads=model.num_heads,
                       window_size=model.window_sizes[0], drop_path_rate=0.0)
    missing, unexpected = theirs.load_state_dict(plugin_to_mmdet_swin(model.state_dict()), strict=False)
    if unexpected or not all(k.endswith('relative_position_index') for k in missing):
        raise RuntimeError(f'mmdet Swin does not take the plugin weights: missing {missing[:3]}, '
                           f'unexpected {unexpected[:3]}')
    return {'mmdet-swin': theirs}


PEERS: dict[str, Callable[[str, nn.Module], dict[str, nn.Module]]] = {
    'swiftformer': swiftformer_peers,
    'swin': swin_peers,
}


def register_peers(family: str, fn: Callable[[str, nn.Module], dict[str, nn.Module]]) -> None:
    """Declare the peers of ``family`` (``fn(arch, model) -> {name: module}``, baseline first)."""
    PEERS[family] = fn


def build_peers(family: str, arch: str, model: nn.Module) -> dict[str, nn.Module]:
    """The peers of ``family`` for the plugin ``model`` of ``arch`` (empty when the family declares none)."""
    fn = PEERS.get(family)
    return fn(arch, model) if fn is not None else {}


def benchmark_models(family: str, arch: str, device: torch.device | str = 'cpu') -> dict[str, nn.Module]:
    """The baseline peer, the plugin model (``'mmplugin'``) and the other peers, in this order, same weights, eval
    mode, on ``device``; just ``{'mmplugin': model}`` for a family without peers."""
    from mmplugin.models.backbones.base import get_family
    ours = get_family(family)(arch)
    peers = build_peers(family, arch, ours)
    if peers:
        first = next(iter(peers))
        models = {first: peers[first], 'mmplugin': ours, **{k: v for k, v in peers.items() if k != first}}
    else:
        models = {'mmplugin': ours}
    for m in models.values():
        m.to(device)
        m.eval()  # mmdet's Swin.train() returns None: no chaining
    return models
