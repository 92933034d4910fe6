"""The relative error every parity check uses (``mmplugin.utils.numerics``): values worked out by hand, float64
evaluation (no rounding of its own at float32 magnitudes), NaN / inf / shape / empty handling, and the vectorised
pairwise form against the scalar one pair by pair."""
from __future__ import annotations

import math

import pytest
import torch

from mmplugin.utils.numerics import max_rel_error, pairwise_rel_error, rel_error


def test_rel_error_by_hand():
    assert rel_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == 0.5  # max|diff| 2 / max|ref| 4
    assert rel_error(torch.tensor([-3.0]), torch.tensor([3.0])) == 2.0
    assert rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert rel_error(torch.tensor([1e-30]), torch.zeros(1)) > 1e270  # any difference from a zero reference is huge
    assert rel_error(torch.zeros(0, 4), torch.zeros(0, 4)) == 0.0


def test_rel_error_is_float64():
    """1 + 2^-30 against 1 in float32 inputs would read 0 (float32 cannot hold the difference); float64 inputs
    carry it, and the metric keeps it exactly."""
    a = torch.tensor([1.0 + 2.0**-30], dtype=torch.float64)
    assert rel_error(a, torch.ones(1, dtype=torch.float64)) == 2.0**-30
    assert rel_error(a.float(), torch.ones(1)) == 0.0


def test_rel_error_non_finite_and_shapes():
    ref = torch.tensor([1.0, float('nan'), float('inf')])
    assert rel_error(torch.tensor([1.0, float('nan'), float('inf')]), ref) == 0.0  # same NaN / inf places
    assert rel_error(torch.tensor([1.0, 2.0, float('inf')]), ref) == math.inf  # NaN missing
    assert rel_error(torch.tensor([float('nan'), float('nan'), float('inf')]), ref) == math.inf  # NaN extra
    with pytest.raises(ValueError, match='shape'):
        rel_error(torch.zeros(3), torch.zeros(2))
    assert max_rel_error([torch.tensor([1.0]), torch.tensor([2.0, 3.0])], [torch.tensor([2.0]),
                                                                          torch.tensor([2.0, 4.0])]) == 0.5
    with pytest.raises(ValueError, match='1 outputs against 2'):
        max_rel_error([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)])


def test_pairwise_matches_pair_by_pair():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 4, generator=g), torch.randn(3, 4, generator=g)
    got = pairwise_rel_error(a, b)
    assert got.shape == (5, 3) and got.dtype == torch.float64
    for i in range(5):
        for j in range(3):
            assert got[i, j].item() == rel_error(a[i], b[j])
    with pytest.raises(ValueError, match='rows'):
        pairwise_rel_error(torch.zeros(2, 4), torch.zeros(2, 5))
