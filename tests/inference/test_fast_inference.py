"""Faster inference without new weights: torch.compile of the backbones (one graph, dynamic sizes, at most one
recompile, outputs equal to eager) and ``--fast`` reduced precision (backbone + neck under autocast, heads fp32,
``auto`` following the hardware's native dtypes, checked against the CPU's own flag list)."""
from __future__ import annotations

import os.path as osp
from pathlib import Path

import pytest
import torch
from conftest import BF16_VS_FP32, FP32_PARITY, tiny_detector
from conftest import tiny_backbone as _tiny

from mmplugin.inference import fast
from mmplugin.utils.numerics import max_rel_error

ROOT = str(Path(__file__).resolve().parents[2])
TOL = FP32_PARITY  # compiled fp32 vs eager fp32: the same function, other kernels (conftest)


# ---------------------------------------------------------------------------------------------------- compile
COMPILE_SHAPES = [(2, 3, 96, 128), (1, 3, 97, 260), (3, 3, 33, 45), (1, 3, 230, 61), (3, 3, 61, 300),
                  (1, 3, 250, 129)]


@pytest.mark.parametrize('family', [pytest.param('swin', marks=pytest.mark.heavy),
                                    pytest.param('swinv2', marks=pytest.mark.heavy), 'swiftformer'])
def test_compile_fullgraph_dynamic_one_recompile(family):
    """fullgraph=True (a graph break raises), dynamic=True: at most one recompile over six sizes (batch 1 and 3,
    non-divisible sizes), outputs equal to eager. Dynamo's capture is what decides graph breaks and recompiles;
    the 'eager' backend replays the captured graph without code generation, to keep the test short."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = _tiny(family)
    cnt = CompileCounterWithBackend('eager')
    compiled = fast.compile_module(_tiny(family), backend=cnt)
    for shape in COMPILE_SHAPES:
        x = torch.randn(*shape)
        with torch.no_grad():
            got, ref = compiled(x), model(x)
        # eager SwiftFormer runs fused oneDNN kernels, the graph standard convs: equal up to summation order
        assert max_rel_error(got, ref) <= TOL, shape
    assert not counters['graph_break'], dict(counters['graph_break'])
    assert 1 <= cnt.frame_count <= 2, f'{cnt.frame_count - 1} recompiles'
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------- fast inference
@pytest.mark.numeric
def test_fast_inference_backbone_neck_low_precision_heads_fp32(monkeypatch):
    """bf16 (forced, as on a CPU without native kernels): the backbone computes in bf16, the FPN maps reach the
    heads as fp32 within bf16's error, the whole Mask R-CNN predicts (mmcv RoIAlign / NMS run fp32)."""
    from mmdet.structures import DetDataSample
    model = tiny_detector()
    x = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        ref = model.extract_feat(x)
    seen = []
    model.backbone.register_forward_hook(lambda m, i, o: seen.extend(t.dtype for t in o))
    monkeypatch.setattr(fast, 'native_dtypes', lambda device='cpu': set())
    with pytest.warns(UserWarning, match='emulated'):
        assert fast.enable_fast_inference(model, 'bf16') is torch.bfloat16
    with torch.no_grad():
        got = model.extract_feat(x)
    from mmplugin.models.layers import prepack
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(id(w) in prepack._FROZEN for w in linears) or not prepack._AVAILABLE  # frozen for packing
    pointwise = {id(m.weight) for m in model.modules()
                 if isinstance(m, torch.nn.Linear) or (isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1))}
    message = fast.fast_inference_message('bf16', torch.bfloat16, model)
    assert (f'{len(pointwise)} linear / 1x1 convolution' in message) == prepack._AVAILABLE, message
    prepack.release_prepacked(model)
    assert set(seen) == {torch.bfloat16}
    assert all(g.dtype == torch.float32 for g in got)
    err = max_rel_error(got, ref)
    assert FP32_PARITY < err < BF16_VS_FP32, err  # beyond fp32 rounding (bf16 really ran), within bf16's (conftest)
    meta = dict(img_shape=(96, 128), ori_shape=(96, 128), scale_factor=(1.0, 1.0), pad_shape=(96, 128),
                batch_input_shape=(96, 128))
    with torch.no_grad():
        out = model.predict(x, [DetDataSample(metainfo=meta), DetDataSample(metainfo=meta)])
    assert out[0].pred_instances.bboxes.dtype == torch.float32


def test_fast_inference_auto_follows_the_hardware(monkeypatch):
    model = tiny_detector()
    plain = model.extract_feat
    monkeypatch.setattr(fast, 'native_low_precision', lambda device='cpu': None)
    with pytest.warns(UserWarning, match='running fp32'):
        assert fast.enable_fast_inference(model, 'auto') is None
    assert model.extract_feat == plain  # fp32 as before (its linear weights frozen for packing, as for bf16)
    monkeypatch.setattr(fast, 'native_low_precision', lambda device='cpu': torch.bfloat16)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # native: no warning
        assert fast.enable_fast_inference(model, 'auto') is torch.bfloat16
    assert model.extract_feat != plain
    from mmplugin.models.layers import prepack
    prepack.release_prepacked(model)
    with pytest.raises(ValueError, match='must be one of'):
        fast.enable_fast_inference(model, 'int8')
    with pytest.raises(TypeError, match='extract_feat'):
        fast.enable_fast_inference(torch.nn.Linear(2, 2), 'bf16')


def test_native_low_precision_cpu_flags():
    """CPU: bf16 only where the processor has bf16 instructions (AVX512-BF16 / AMX); the reference is the kernel's
    own flag list, not torch."""
    flags = set()
    if osp.exists('/proc/cpuinfo'):
        for line in open('/proc/cpuinfo'):
            if line.startswith('flags'):
                flags |= set(line.split(':', 1)[1].split())
    if not flags:
        pytest.skip('no /proc/cpuinfo flags on this platform')
    if flags & {'avx512_bf16', 'amx_bf16'}:
        assert fast.native_low_precision('cpu') is torch.bfloat16
    else:  # AVX2, and AVX512 without BF16: emulated bf16, so --fast auto stays fp32
        assert fast.native_low_precision('cpu') is None and fast.native_dtypes('cpu') == set()
