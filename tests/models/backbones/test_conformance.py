"""The backbone contract (mmplugin.testing.conformance), checked for every registered family and every named arch."""
from __future__ import annotations

import pytest

import mmplugin  # noqa: F401
from mmplugin.models.backbones.base import FAMILIES, detect_family
from mmplugin.testing.conformance import (
    check_bad_input,
    check_declared_shapes,
    check_empty_batch,
    check_freezing,
    check_grad_strides,
    check_layer_depths,
    check_norm_eval,
    check_reduced_precision,
    check_state_dict_roundtrip,
    check_with_cp,
)

CASES = [(name, arch) for name, cls in FAMILIES.items() for arch in cls.arch_names()]
IDS = [f'{name}-{arch}' for name, arch in CASES]
# The training-step checks run on each family's smoke arch: the named archs differ from it only in widths and
# depths, and their declarations, depths and detection are checked one by one above.
SMOKE = [(name, cls.smallest_arch()) for name, cls in FAMILIES.items()]
SMOKE_IDS = [f'{name}-smoke' for name, _ in SMOKE]


def test_every_family_is_declared_completely():
    assert {'swiftformer', 'swin', 'swinv2'} <= set(FAMILIES)
    for name, cls in FAMILIES.items():
        assert cls.family == name and cls.arch_zoo and cls.arch_keys and cls.converter is not None
        assert cls.default_arch() in cls.arch_zoo


@pytest.mark.parametrize('family,arch', CASES, ids=IDS)
def test_named_arch(family, arch):
    """Every named arch: declared outputs, layer depths, and its checkpoints recognised as its family only."""
    cls = FAMILIES[family]
    model = cls(arch, drop_path_rate=0.0)
    check_declared_shapes(cls, arch, model)
    check_layer_depths(cls, arch, model)
    assert detect_family(model.state_dict()) is cls


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_declared_shapes_and_output_order(family, arch):
    check_declared_shapes(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_state_dict_roundtrip(family, arch, tmp_path):
    check_state_dict_roundtrip(FAMILIES[family], arch, tmp_path)


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_freezing(family, arch):
    check_freezing(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_norm_eval_keeps_running_statistics(family, arch):
    if not check_norm_eval(FAMILIES[family], arch):
        pytest.skip(f'{family} has no BatchNorm')


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_with_cp_after_construction(family, arch, monkeypatch):
    check_with_cp(FAMILIES[family], arch, monkeypatch)


@pytest.mark.numeric
@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_reduced_precision(family, arch):
    check_reduced_precision(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_bad_input(family, arch):
    check_bad_input(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_empty_batch(family, arch):
    check_empty_batch(FAMILIES[family], arch)


@pytest.mark.parametrize('family,arch', SMOKE, ids=SMOKE_IDS)
def test_grad_strides_match_parameters(family, arch):
    check_grad_strides(FAMILIES[family], arch)
