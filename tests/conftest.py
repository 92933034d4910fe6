"""Shared fixtures and helpers for the test suite."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import mmplugin  # noqa: F401  (registers models, installs safe loading)
from mmplugin.testing.numeric import (  # noqa: F401
    BF16_VS_FP32,
    FP32_PARITY,
    FP64_PARITY,
    PARITY_DEPTH,
    PARITY_TERMS,
    U_BF16,
    U_FP32,
    U_FP64,
    outputs_in_float64,
    probabilistic_bound,
    randomize_,
    worst_case_bound,
)
from mmplugin.utils.numerics import rel_error as rel_err  # noqa: F401  (max|a - b| / max|b| in float64)

DATA = Path(__file__).parent / 'data'
ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / 'configs'


def require_compiler() -> None:
    """Skip the test where there is no C compiler for the plugin's kernels (where there is one, a kernel that does not
    build is a failure, not a skip)."""
    from mmplugin.ops import build
    try:
        build._compiler()
    except build.KernelUnavailable as e:
        pytest.skip(str(e))


def isa_kernel(library: str, isa: str, function: str, argtypes: list):
    """``function`` of the plugin's C ``library`` built for the vector ``isa`` (a key of
    :data:`mmplugin.ops.build.ISA_FLAGS`), typed with ``argtypes``. The test skips where this CPU cannot run that
    ISA's code, where there is no C compiler, and for AVX512_BF16 where the compiler has no bf16 instructions; any
    other build failure (an error in the sources) fails it."""
    import ctypes

    from mmplugin.ops import build
    runs = {'AVX512_BF16': torch.cpu._is_avx512_bf16_supported(), 'AVX512': torch.cpu._is_avx512_supported(),
            'AVX2': torch.cpu._is_avx2_supported(), 'DEFAULT': True}
    if not runs[isa]:
        pytest.skip(f'this CPU cannot run {isa} code')
    require_compiler()
    try:
        fn = getattr(build.load_kernels(library, isa), function)
    except build.KernelUnavailable as e:
        if isa != 'AVX512_BF16':
            raise
        pytest.skip(f'no {isa} build: {e}')
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


def with_env_dump(text: str, work_dir: Path | None = None) -> str:
    """``text`` plus the run logs it names: the tools print mmengine's environment and config dump (world size,
    launcher, wrapper types) to the log file only, behind one ``environment and config: FILE`` line.

    With ``work_dir``, the run logs under it (``WORK_DIR/TIMESTAMP/TIMESTAMP.log``) are read whether or not the
    console names them: several ranks share one console pipe, and a check of what rank 0 logged should not depend on
    how their lines interleave there."""
    files = re.findall(r'environment and config: (\S+)', text)
    if work_dir is not None:
        files += [str(f) for f in sorted(Path(work_dir).glob('*/*.log'))]
    return text + ''.join(Path(f).read_text() for f in dict.fromkeys(files) if Path(f).is_file())


def official_keys(path: Path, section: str) -> dict[str, tuple[int, ...]]:
    """Parse ``key (d0, d1, ...)`` lines of the section whose header contains ``section``."""
    out, inside = {}, False
    for line in path.read_text().splitlines():
        if line.startswith(('===', '##')):
            inside = section in line
            continue
        m = re.match(r'\s+(\S+) \(([\d, ]*)\)$', line)
        if inside and m:
            out[m.group(1)] = tuple(int(d) for d in m.group(2).replace(' ', '').split(',') if d)
    return out


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors of the given shapes (BN variances positive, index buffers integer)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in shapes.items():
        if k.endswith('num_batches_tracked'):
            sd[k] = torch.tensor(7)
        elif k.endswith(('relative_position_index', )):
            sd[k] = torch.randint(0, 10, shape, generator=g)
        elif k.endswith('running_var'):
            sd[k] = torch.rand(shape, generator=g) + 0.5
        else:
            sd[k] = torch.randn(shape, generator=g) * 0.3
    return sd


# Tiny archs of the three families: every capture, compile and export stays short; the window machinery, padding
# and shift masks are the same code as at full size.
TINY_SWIN_ARCH = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])
TINY_SWIFTFORMER_ARCH = dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48])


def tiny_backbone(family: str) -> torch.nn.Module:
    """A tiny ``'swin' | 'swinv2' | 'swiftformer'`` backbone in eval mode with random weights everywhere (norms and
    biases too, so parity cannot pass by accident)."""
    from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2
    torch.manual_seed(0)
    if family == 'swin':
        m = SwinTransformer(TINY_SWIN_ARCH, drop_path_rate=0.)
    elif family == 'swinv2':
        m = SwinTransformerV2(TINY_SWIN_ARCH, window_size=8, drop_path_rate=0.)
    else:
        m = SwiftFormer(TINY_SWIFTFORMER_ARCH, drop_path_rate=0.)
    return randomize_(m, seed=1).eval()


def swin_kernel_training_case(v2: bool, monkeypatch):
    """A padded, shifted small Swin (V1 or V2) in CPU training, counting the calls of the window-attention kernels
    on the map's layout, with the official formulation's float64 gradients of the same weights and output
    weighting: ``(model, x, weights, want, calls)``; ``want`` maps parameter names to gradients, ``calls`` grows by
    one per kernel forward."""
    from mmplugin.models.backbones import SwinTransformer, SwinTransformerV2
    from mmplugin.models.layers import recompute
    from mmplugin.reference.swin import ReferenceSwin
    calls = []
    fwd = recompute._KernelMapAttention.forward
    monkeypatch.setattr(recompute._KernelMapAttention, 'forward', staticmethod(lambda *a: calls.append(1) or fwd(*a)))
    arch = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])
    cls = SwinTransformerV2 if v2 else SwinTransformer
    model = randomize_(cls(arch, window_size=7, drop_path_rate=0.0), seed=5).train()
    ref = ReferenceSwin(arch['embed_dims'], arch['depths'], arch['num_heads'], 7, v2, 0).double().train()
    ref.load_state_dict(model.state_dict(), strict=True)
    x = torch.randn(2, 3, 71, 90, generator=torch.Generator().manual_seed(0))
    weights = [torch.randn(o.shape, dtype=torch.float64) for o in ref(x.double())]
    sum((o * w).sum() for o, w in zip(ref(x.double()), weights)).backward()
    want = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    return model, x, weights, want, calls


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope='session')
def _no_weights_only_override():
    assert 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD' not in os.environ
    yield


# ---------------------------------------------------------------- whole models from configs, and tiny batches
def _build(cfg):
    if cfg.get('default_scope', 'mmdet') == 'mmseg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    return MODELS.build(cfg.model)


def _fewer_rois(cfg, rois=64):
    """Shrink the RoI workload, not the model: ``rois`` sampled RoIs per image and stage in training (64 by
    default), 100 proposals at test time. The configs' 512 / 1000 put ~2 TFLOP per step into the 4-conv heads of
    the 3x cascade configs, about a minute on 2 cores. The layers, losses and optimiser stay the config's."""
    train, test = cfg.model.get('train_cfg') or {}, cfg.model.get('test_cfg') or {}
    rcnn = train.get('rcnn')
    for stage in (rcnn if isinstance(rcnn, list) else [rcnn] if rcnn else []):
        if stage and stage.get('sampler') and 'num' in stage.sampler:
            stage.sampler.num = min(stage.sampler.num, rois)
    for key, cap in (('rpn_proposal', train), ('rpn', test)):  # None where a detector has no RPN (Sparse R-CNN)
        if cap.get(key) and 'max_per_img' in cap[key]:
            cap[key].max_per_img = min(cap[key].max_per_img, 100)


def tiny_detector():
    """The demo SwiftFormer-XS Mask R-CNN with a smaller backbone and random weights (eval): fast whole-detector
    checks."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(str(CONFIGS / 'demo/swiftformer_xs_maskrcnn_shapes.py'))
    init_default_scope('mmdet')
    cfg.model.backbone.arch = dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48])
    cfg.model.neck.in_channels = [16, 24, 32, 48]
    torch.manual_seed(0)
    return randomize_(MODELS.build(cfg.model), seed=4).eval()


def _det_batch(model, size=96):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    samples = []
    for i in range(2):
        s = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size),
                                        scale_factor=(1., 1.), batch_input_shape=(size, size), img_id=i))
        gt = InstanceData()
        gt.bboxes = torch.tensor([[10., 12., 60., 70.], [30., 5., 90., 40.]])
        gt.labels = torch.tensor([1, 3])
        masks = torch.zeros(2, size, size, dtype=torch.uint8)
        masks[0, 12:70, 10:60] = 1
        masks[1, 5:40, 30:90] = 1
        gt.masks = BitmapMasks(masks.numpy(), size, size)
        s.gt_instances = gt
        if getattr(getattr(model, 'roi_head', None), 'with_semantic', False):  # HTC's COCO-stuff branch
            from mmengine.structures import PixelData
            s.gt_sem_seg = PixelData(sem_seg=torch.randint(0, 183, (1, size, size)))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8) for _ in range(2)],
                data_samples=samples)


def _seg_batch(size=64):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, size, size)))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8) for _ in range(2)],
                data_samples=samples)


def _check_channels(cfg, model):
    out = list(model.backbone.out_channels)
    if 'neck' in cfg.model and 'in_channels' in cfg.model.neck:
        assert list(cfg.model.neck.in_channels) == out
    if cfg.model.get('decode_head') and cfg.model.get('neck') is None:
        assert list(cfg.model.decode_head.in_channels) == out
    aux = cfg.model.get('auxiliary_head')
    if aux and cfg.model.get('neck') is None:
        idx = aux.get('in_index', 2)
        assert aux.in_channels == out[idx]
