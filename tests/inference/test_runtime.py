"""Backbone + neck in OpenVINO / onnxruntime, heads in PyTorch (``--runtime``): the maps equal eager's within fp32
rounding at every shape, one OpenVINO compile per input shape (cached, least recently used dropped), the PyTorch
heads fed the runtime's maps, and the precision follows ``--fast`` and the hardware."""
from __future__ import annotations

import pytest
import torch
from conftest import FP32_PARITY, tiny_detector

from mmplugin.inference import runtime as rt
from mmplugin.utils.errors import ConfigValueError
from mmplugin.utils.numerics import max_rel_error

SHAPES = [(1, 3, 96, 128), (2, 3, 64, 96), (1, 3, 96, 128)]


@pytest.fixture(scope='module')
def detector():
    return tiny_detector()


@pytest.mark.parametrize('runtime', ['openvino', pytest.param('onnxruntime', marks=pytest.mark.heavy)])
def test_runtime_maps_equal_eager_at_every_shape(detector, runtime):
    """Same weights, other kernels: the FPN maps within fp32 rounding (FP32_PARITY, conftest) at each shape;
    OpenVINO compiles once per new shape (the repeated shape is served from the cache)."""
    feats = rt.RuntimeFeatures(detector, runtime)
    try:
        for shape in SHAPES:
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[2]))
            with torch.no_grad():
                ref = detector.extract_feat(x)
            got = feats(x)
            assert len(got) == len(ref) and all(g.shape == r.shape for g, r in zip(got, ref))
            assert all(g.dtype == torch.float32 for g in got)
            assert max_rel_error(got, ref) <= FP32_PARITY, shape
        assert feats.stats['calls'] == 3
        assert feats.stats['compiles'] == (2 if runtime == 'openvino' else 0)
    finally:
        feats.close()


def test_openvino_cache_drops_the_least_recently_used(detector):
    feats = rt.RuntimeFeatures(detector, 'openvino', cache_size=1)
    try:
        for shape in [(1, 3, 64, 64), (1, 3, 64, 96), (1, 3, 64, 64)]:
            feats(torch.randn(*shape))
        assert feats.stats['compiles'] == 3 and list(feats._compiled) == [(1, 3, 64, 64)]
    finally:
        feats.close()


@pytest.mark.heavy
def test_enable_runtime_serves_the_heads(detector):
    """With extract_feat in OpenVINO, the PyTorch heads get maps equal to eager's within fp32 rounding: the RPN's
    class scores and box deltas agree to that rounding, the whole Mask R-CNN predicts (RoIAlign, NMS, mask head in
    PyTorch), and the state_dict keys and values are unchanged. (The trained demo detector's AP through
    tools/test.py --runtime openvino equals eager's within 0.001: tests/cli/test_tools_end_to_end.py.)"""
    import copy

    from mmdet.structures import DetDataSample
    model = copy.deepcopy(detector)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    meta = dict(img_shape=(96, 128), ori_shape=(96, 128), scale_factor=(1.0, 1.0), pad_shape=(96, 128),
                batch_input_shape=(96, 128))
    with torch.no_grad():
        ref = model.rpn_head(model.extract_feat(x))
    feats = rt.enable_runtime(model, 'openvino')
    try:
        with torch.no_grad():
            got = model.rpn_head(model.extract_feat(x))
            out = model.predict(x, [DetDataSample(metainfo=meta)])[0]
        for g, r in zip(got, ref):  # (scores per level, deltas per level)
            assert max_rel_error(g, r) <= FP32_PARITY
        assert out.pred_instances.bboxes.dtype == torch.float32 and feats.stats['calls'] == 2
    finally:
        feats.close()
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_runtime_precision_follows_fast_and_the_hardware(monkeypatch):
    from mmplugin.inference import fast
    assert rt.runtime_precision('openvino', None) == 'f32'
    assert rt.runtime_precision('openvino', 'bf16') == 'bf16'
    assert rt.runtime_precision('openvino', 'fp16') == 'f16'
    monkeypatch.setattr(fast, 'native_dtypes', lambda device='cpu': set())
    assert rt.runtime_precision('openvino', 'auto') == 'f32'
    monkeypatch.setattr(fast, 'native_dtypes', lambda device='cpu': {torch.bfloat16})
    assert rt.runtime_precision('openvino', 'auto') == 'bf16'
    with pytest.raises(ConfigValueError, match='onnxruntime runs the exported fp32 graph'):
        rt.runtime_precision('onnxruntime', 'auto')


def test_runtime_refuses_what_it_cannot_serve(detector):
    with pytest.raises(ConfigValueError, match='--runtime must be one of'):
        rt.enable_runtime(detector, 'tensorrt')
    with pytest.raises(ConfigValueError, match='runs on the CPU'):
        rt.enable_runtime(detector, 'openvino', device='cuda')
    with pytest.raises(ConfigValueError, match='has no extract_feat'):
        rt.enable_runtime(torch.nn.Linear(2, 2), 'openvino')
    assert rt.enable_runtime(detector, 'pytorch') is None
