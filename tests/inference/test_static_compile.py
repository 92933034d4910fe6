"""``--compile static``: backbone + neck compiled per input size with frozen weights. The maps equal eager's within
fp32 rounding (bf16 autocast: within the bf16 bound), one compile per new size and none for a size seen before,
sizes beyond the limit run eager, gradient mode is refused (frozen weights would silently ignore later updates), and
the tools' options combine as documented."""
from __future__ import annotations

import argparse

import pytest
import torch
from conftest import BF16_VS_FP32, FP32_PARITY, tiny_detector

from mmplugin.cli.common import CfgOptionError
from mmplugin.cli.inference_options import add_inference_options, apply_inference_options
from mmplugin.inference.compiled import StaticCompiledFeatures, enable_static_compile
from mmplugin.utils.errors import ConfigValueError
from mmplugin.utils.numerics import max_rel_error


@pytest.fixture(scope='module')
def detector():
    return tiny_detector()


def _image(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_one_graph_per_size_and_eager_beyond_the_limit(detector):
    """With a counting backend (dynamo's capture, eager kernels): a repeated size reuses its graph, a new size
    compiles, a size beyond ``max_sizes`` runs eager and is counted; every call returns eager's maps."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    cnt = CompileCounter()
    feats = StaticCompiledFeatures(detector, max_sizes=2, backend=cnt)
    shapes = [(1, 3, 64, 96), (1, 3, 64, 96), (2, 3, 64, 64), (1, 3, 96, 96), (1, 3, 64, 96)]
    with torch.no_grad():
        for i, shape in enumerate(shapes):
            x = _image(shape, i)
            got, ref = feats(x), detector.extract_feat(x)
            assert len(got) == len(ref) and all(g.shape == r.shape for g, r in zip(got, ref))
            assert max_rel_error(got, ref) <= FP32_PARITY, shape
    assert cnt.frame_count == 2  # (1, 3, 64, 96) and (2, 3, 64, 64); (1, 3, 96, 96) beyond the limit
    assert feats.stats == dict(feats.stats, compiles=2, calls=5, eager_calls=1)
    assert '2 size(s) compiled' in feats.message() and '1 eager (beyond 2 sizes)' in feats.message()


def test_gradient_mode_and_bad_arguments_are_refused(detector):
    feats = StaticCompiledFeatures(detector, backend='eager')
    with pytest.raises(RuntimeError, match='inference only'):
        feats(_image((1, 3, 64, 64)))
    with torch.no_grad(), pytest.raises(TypeError, match='image tensor'):
        feats([_image((3, 64, 64))])
    with pytest.raises(ConfigValueError, match='max_sizes must be >= 1'):
        StaticCompiledFeatures(detector, max_sizes=0)
    with pytest.raises(ConfigValueError, match='has no extract_feat'):
        StaticCompiledFeatures(torch.nn.Linear(2, 2))


@pytest.mark.heavy
@pytest.mark.numeric
def test_inductor_frozen_maps_equal_eager(detector):
    """The real compile (inductor, frozen weights, static shape): fp32 maps within fp32 rounding of eager's, bf16
    autocast (what ``--fast`` adds) within the bf16 bound of eager fp32; the model's state dict is untouched."""
    import copy
    model = copy.deepcopy(detector)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = _image((1, 3, 64, 96), 3)
    with torch.no_grad():
        ref = model.extract_feat(x)
        feats = enable_static_compile(model)
        assert model.extract_feat is feats
        got = model.extract_feat(x)
        assert max_rel_error(got, ref) <= FP32_PARITY
        with torch.autocast('cpu', dtype=torch.bfloat16):
            low = model.extract_feat(x)
        assert max_rel_error(low, ref) <= BF16_VS_FP32
    assert feats.stats['compiles'] == 2  # the autocast state is part of the graph's key
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def _args(*argv):
    p = argparse.ArgumentParser()
    add_inference_options(p)
    return p.parse_args(list(argv))


def test_tool_options(detector, monkeypatch, capsys):
    """``--compile`` alone keeps its meaning (dynamic shapes); ``static`` installs the per-size compile before
    ``--fast`` wraps it in autocast; ``--compile-sizes`` without ``static`` and ``--compile`` with another runtime are
    errors, not ignored."""
    import copy
    assert _args('--compile').compile == 'dynamic' and _args().compile is None
    assert _args('--compile', 'static', '--compile-sizes', '3').compile_sizes == 3
    with pytest.raises(CfgOptionError, match='--compile-sizes'):
        apply_inference_options(copy.deepcopy(detector), _args('--compile', '--compile-sizes', '3'), 'cpu')
    with pytest.raises(CfgOptionError, match='pass one of them'):
        apply_inference_options(copy.deepcopy(detector), _args('--compile=static', '--runtime', 'openvino'), 'cpu')
    import mmplugin.inference.fast as fast
    monkeypatch.setattr(fast, 'native_low_precision', lambda device: torch.bfloat16)
    model = copy.deepcopy(detector)
    feats = apply_inference_options(model, _args('--compile=static', '--compile-sizes', '3', '--fast'), 'cpu')
    assert isinstance(feats, StaticCompiledFeatures) and feats.max_sizes == 3
    assert model.extract_feat is not feats  # --fast's autocast wrapper around the compiled function
    assert '--compile static' in capsys.readouterr().out
