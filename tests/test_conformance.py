"""The backbone contract (tests/conformance.py), checked for every registered family and every named arch."""
from __future__ import annotations

import pytest
from conformance import (check_bad_input, check_bf16, check_declared_shapes, check_empty_batch, check_freezing,
                         check_grad_strides, check_layer_depths, check_norm_eval, check_state_dict_roundtrip, check_with_cp)

import mmplugin  # noqa: F401
from mmplugin.models.backbones.base import FAMILIES

CASES = [(name, arch) for name, cls in FAMILIES.items() for arch in cls.arch_names()]
IDS = [f'{name}-{arch}' for name, arch in CASES]
# The gradient-heavy checks run on the smallest arch of each family (the others differ only in widths/depths).
SMALL = [(name, cls.arch_names()[0]) for name, cls in FAMILIES.items()]


def test_every_family_is_declared_completely():
    assert {'swiftformer', 'swin', 'swinv2'} <= set(FAMILIES)
    for name, cls in FAMILIES.items():
        assert cls.family == name and cls.arch_zoo and cls.arch_keys and cls.converter is not None
        assert cls.default_arch() in cls.arch_zoo


@pytest.mark.parametrize('family,arch', CASES, ids=IDS)
def test_declared_shapes(family, arch):
    check_declared_shapes(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', CASES, ids=IDS)
def test_state_dict_roundtrip_and_detection(family, arch, tmp_path):
    check_state_dict_roundtrip(FAMILIES[family], arch, tmp_path)


@pytest.mark.parametrize('family,arch', CASES, ids=IDS)
def test_layer_depths(family, arch):
    check_layer_depths(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMALL)
def test_freezing(family, arch):
    check_freezing(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMALL)
def test_norm_eval_keeps_running_statistics(family, arch):
    if not check_norm_eval(FAMILIES[family], arch):
        pytest.skip(f'{family} has no BatchNorm')


@pytest.mark.parametrize('family,arch', SMALL)
def test_with_cp_after_construction(family, arch, monkeypatch):
    check_with_cp(FAMILIES[family], arch, monkeypatch)


@pytest.mark.parametrize('family,arch', SMALL)
def test_bf16(family, arch):
    check_bf16(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMALL)
def test_bad_input(family, arch):
    check_bad_input(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMALL)
def test_empty_batch(family, arch):
    check_empty_batch(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMALL)
def test_grad_strides_match_parameters(family, arch):
    check_grad_strides(FAMILIES[family], arch)
