"""The contract every backbone family must keep, as reusable checks (needs pytest).

Each ``check_*(cls, arch, ...)`` builds its own models of the :class:`~mmplugin.models.backbones.base.BaseBackbone`
subclass ``cls`` at ``arch`` and raises ``AssertionError`` naming what broke, so families can be checked in any
order. The repository's ``tests/models/backbones/test_conformance.py`` runs them over every registered family and
arch; ``tests/models/backbones/test_toy_family.py`` runs them on a family defined inside the test, which shows a new
family needs nothing outside its own folder. A family in another package runs them from its own tests
(``docs/extending.md``)::

    from mmplugin.testing.conformance import ALL_CHECKS, check_state_dict_roundtrip, check_with_cp

    @pytest.mark.parametrize('check', ALL_CHECKS)
    def test_conformance(check):
        check(MyBackbone, 'tiny')

Tolerances are those of :mod:`mmplugin.testing.numeric`.
"""
from __future__ import annotations

import copy
import itertools
import math

import torch
import torch.utils._python_dispatch
import torch.utils.checkpoint
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmplugin.models.backbones.base import BaseBackbone, detect_family
from mmplugin.testing.numeric import FP32_PARITY, REDUCED_VS_FP32, randomize_
from mmplugin.utils.numerics import rel_error

__all__ = ['SIZES', 'ALL_CHECKS', 'build', 'check_declared_shapes', 'check_empty_batch', 'check_freezing',
           'check_norm_eval', 'check_with_cp', 'check_grad_strides', 'check_reduced_precision', 'check_bf16',
           'check_bad_input',
           'check_state_dict_roundtrip', 'check_layer_depths']

SIZES = [(64, 64), (37, 53)]


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere, so equalities cannot hold by accident (:func:`randomize_` at a milder scale)."""
    return randomize_(model, seed, scale=0.2)


def build(cls: type[BaseBackbone], arch, **kwargs) -> BaseBackbone:
    """``cls(arch, **kwargs)`` without stochastic depth unless asked for (so outputs are deterministic)."""
    kwargs.setdefault('drop_path_rate', 0.0)
    return cls(arch, **kwargs)


def check_declared_shapes(cls, arch, model: BaseBackbone | None = None) -> None:
    """Outputs follow ``out_channels`` / ``out_strides`` / ``output_shape()``, in ascending stage order
    (``model``: an already built default instance of ``arch``, to save building it again)."""
    models = [model if model is not None else build(cls, arch)]
    if model is None:
        models += [build(cls, arch, out_indices=(3, 1)), build(cls, arch, out_indices=(2, ))]
    for model in models:
        model.eval()
        assert list(model.out_indices) == sorted(model.out_indices)
        assert [d['channels'] for d in model.output_shape()] == model.out_channels
        assert [d['stride'] for d in model.output_shape()] == model.out_strides
        assert model.out_channels == [model.stage_channels[i] for i in model.out_indices]
        assert all(b > a for a, b in zip(model.out_strides, model.out_strides[1:]))
        for n, (h, w) in zip((1, 2), SIZES):
            with torch.no_grad():
                outs = model(torch.randn(n, model.in_channels, h, w))
            assert len(outs) == len(model.out_indices)
            for o, c, s in zip(outs, model.out_channels, model.out_strides):
                assert tuple(o.shape) == (n, c, math.ceil(h / s), math.ceil(w / s)), (o.shape, c, s, h, w)
                assert o.is_contiguous(), 'outputs must be contiguous NCHW (mmcv ops read raw memory)'


def check_empty_batch(cls, arch) -> None:
    """A batch of 0 images gives empty maps of the declared channels and sizes (mmdet sends such batches)."""
    model = build(cls, arch).eval()
    outs = model(torch.randn(0, model.in_channels, 45, 61))
    assert [tuple(o.shape) for o in outs] == [(0, c, math.ceil(45 / s), math.ceil(61 / s))
                                              for c, s in zip(model.out_channels, model.out_strides)]


def _frozen_param_ids(model: BaseBackbone, fs: int) -> set[int]:
    mods = list(model.stem_modules()) if fs >= 0 else []
    for i in range(min(fs, model.num_stages)):
        mods += model.stage_modules(i)
        if i in model.out_indices:
            mods.append(getattr(model, f'norm{i}'))
    return {id(p) for m in mods for p in m.parameters()}


def check_freezing(cls, arch) -> None:
    """``frozen_stages=k`` fixes exactly the stem and stages 1..k (and their output norms) from construction on:
    no gradient, weights and BatchNorm statistics unchanged by a training step, eval mode kept by ``train()``."""
    for fs in range(-1, cls.num_stages + 1):
        model = _randomize(build(cls, arch, frozen_stages=fs))
        frozen = _frozen_param_ids(model, fs)
        if fs >= 0:
            assert frozen, 'frozen_stages >= 0 must freeze something'
        for n, p in model.named_parameters():
            assert p.requires_grad == (id(p) not in frozen), (fs, n)
        if fs not in (0, cls.num_stages - 1):
            continue  # the training step below is checked on two settings to keep the suite short
        model.train()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        outs = model(torch.randn(2, model.in_channels, 64, 64))
        sum(o.pow(2).mean() for o in outs).backward()
        opt.step()
        frozen_names = {n for n, p in model.named_parameters() if id(p) in frozen}
        frozen_mods = [m for m in model.modules() if any(id(p) in frozen for p in m.parameters(recurse=False))]
        assert all(not m.training for m in frozen_mods)
        after = model.state_dict()
        for k in frozen_names:
            assert torch.equal(after[k], before[k]), k
        for name, m in model.named_modules():
            if isinstance(m, _BatchNorm) and id(m.weight) in frozen:
                assert torch.equal(after[f'{name}.running_mean'], before[f'{name}.running_mean']), name
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert any(not torch.equal(after[n], before[n]) for n in trainable), 'nothing trained'


def check_norm_eval(cls, arch) -> bool:
    """With ``norm_eval=True`` a training step leaves every BatchNorm's running statistics unchanged (and without
    it they change). Returns False when the family has no BatchNorm (nothing to check)."""
    stats = {}
    for norm_eval in (True, False):
        model = _randomize(build(cls, arch, norm_eval=norm_eval)).train()
        bns = {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm)}
        if not bns:
            return False
        before = {n: m.running_mean.clone() for n, m in bns.items()}
        model(torch.randn(2, model.in_channels, 64, 64))
        stats[norm_eval] = [torch.equal(m.running_mean, before[n]) for n, m in bns.items()]
        assert model.training
    assert all(stats[True]), 'norm_eval=True let running statistics change'
    assert not any(stats[False]), 'without norm_eval the statistics should update (the check would be vacuous)'
    return True


def check_with_cp(cls, arch, monkeypatch) -> None:
    """Gradient checkpointing, switched on after construction, really recomputes blocks and changes nothing."""
    a = _randomize(build(cls, arch), seed=3).train()
    b = build(cls, arch).train()
    b.load_state_dict(a.state_dict())
    b.set_grad_checkpointing(True)
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, 'checkpoint', lambda *args, **kw: calls.append(1) or real(*args, **kw))
    x = torch.randn(2, a.in_channels, 48, 40, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.manual_seed(0)
    oa = a(x)
    torch.manual_seed(0)
    ob = b(x2)
    assert calls, 'with_cp did not checkpoint any block'
    for p, q in zip(oa, ob):
        assert rel_error(q, p) < FP32_PARITY  # the same operations; only their scheduling may differ
    sum((o * o).mean() for o in oa).backward()
    sum((o * o).mean() for o in ob).backward()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        if p.grad is not None:
            assert rel_error(q.grad, p.grad) < FP32_PARITY, n
    assert rel_error(x2.grad, x.grad) < FP32_PARITY


def check_grad_strides(cls, arch) -> None:
    """Every gradient has its parameter's strides, so DDP copies nothing ("Grad strides do not match bucket view
    strides" never fires) and optimisers update in place."""
    model = build(cls, arch).train()
    outs = model(torch.randn(2, model.in_channels, 40, 48))
    sum(o.pow(2).mean() for o in outs).backward()
    bad = [(n, p.stride(), p.grad.stride()) for n, p in model.named_parameters()
           if p.grad is not None and p.grad.stride() != p.stride()]
    assert not bad, bad[:5]


_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def _dtype_hooks(model: nn.Module, dtype: torch.dtype, wrong: list[str]):
    """Forward hooks recording every submodule whose floating-point output is not ``dtype``."""
    def hook(module, _inputs, out):
        outs = out if isinstance(out, (tuple, list)) else (out, )
        for o in outs:
            if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype != dtype:
                wrong.append(f'{type(module).__name__} -> {o.dtype}')
    return [m.register_forward_hook(hook) for m in model.modules()]


# the layers' products that autocast runs in its lower precision (linear: mm / addmm, convolutions) and the oneDNN
# fused forms the plugin calls for some of them (mmplugin.models.layers.fusion, on no autocast list): these must see
# the autocast dtype. Batched products are left out: SDPA's math fallback and fp32 reductions (fp16 norms) run them
# in fp32 on purpose.
_GEMM_OPS = {'aten::mm': 0, 'aten::addmm': 1, 'aten::convolution': 0, 'mkldnn::_linear_pointwise': 0,
             'mkldnn::_convolution_pointwise': 0}  # op -> position of its input matrix


class _GemmDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records ``(op, dtype of its input)`` of every product in :data:`_GEMM_OPS` that runs inside it (below
    autocast, so the dtypes are what the kernels received)."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, torch.dtype]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        at = _GEMM_OPS.get(func.overloadpacket._qualified_op_name)
        if at is not None and len(args) > at and isinstance(args[at], torch.Tensor):
            self.seen.add((func.overloadpacket._qualified_op_name, args[at].dtype))
        return func(*args, **(kwargs or {}))


def check_reduced_precision(cls, arch, dtypes=('bf16', 'fp16'), sizes=SIZES, scales=(1.0, 1e3),
                            device: str = 'cpu') -> None:
    """fp16 and bf16, under autocast and as a whole model cast with ``.to(dtype)``, at every size of ``sizes``
    (divisible and not: padding, shifted windows) and at inputs scaled up to ``scales``: every output is finite
    and within ``REDUCED_VS_FP32[dtype]`` of fp32 (eval, default init); a cast model computes in its dtype end to
    end (every submodule's output, and the returned maps); under autocast every linear and convolution (oneDNN fused
    forms included) runs in the autocast dtype; autocast training gives finite outputs and gradients.
    ``device``: where to run (``tools/gpu_check.py`` runs it on CUDA).
    """
    device_type = torch.device(device).type
    for name in dtypes:
        dtype, bound = _DTYPES[name], REDUCED_VS_FP32[name]
        model = build(cls, arch).to(device).train()
        x = torch.randn(1, model.in_channels, 64, 64, device=device)
        with torch.autocast(device_type, dtype=dtype):
            outs = model(x)
            loss = sum(o.float().pow(2).mean() for o in outs)
        loss.backward()
        assert all(torch.isfinite(o.float()).all() for o in outs), f'{name} autocast training: non-finite output'
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f'{name} autocast training: non-finite gradients of {bad[:3]}'
        model.eval()
        low = copy.deepcopy(model).to(dtype)
        for (h, w), scale in itertools.product(sizes, scales):
            x = torch.randn(2, model.in_channels, h, w, device=device) * scale
            with torch.no_grad():
                ref = model(x)
                gemms = _GemmDtypes()
                with torch.autocast(device_type, dtype=dtype), gemms:
                    auto = model(x)
                wrong: list[str] = []
                hooks = _dtype_hooks(low, dtype, wrong)
                try:
                    cast = low(x.to(dtype))
                finally:
                    for hk in hooks:
                        hk.remove()
            where = f'{name}, {h}x{w}, input scale {scale:g}'
            assert not wrong, f'{where}: .to({dtype}) model left its dtype in {sorted(set(wrong))[:4]}'
            other = sorted(f'{op} in {dt}' for op, dt in gemms.seen if dt != dtype)
            assert not other, f'{where}, autocast: products outside {dtype}: {other}'
            for mode, got in (('autocast', auto), ('cast model', cast)):
                for i, (o, r) in enumerate(zip(got, ref)):
                    assert torch.isfinite(o).all(), f'{where}, {mode}: output {i} is not finite'
                    err = rel_error(o, r)
                    assert err < bound, (f'{where}, {mode}: output {i} differs from fp32 by {err:.3g} '
                                         f'(bound {bound:.3g})')
            assert all(o.dtype == dtype for o in cast)


def check_bf16(cls, arch) -> None:
    """:func:`check_reduced_precision` in bf16 only."""
    check_reduced_precision(cls, arch, dtypes=('bf16', ))


def check_bad_input(cls, arch) -> None:
    """Wrong channel count, a missing batch dimension and integer images raise errors that say what was expected."""
    import pytest
    model = build(cls, arch).eval()
    c = model.in_channels
    with pytest.raises(ValueError, match=f'expected {c} input channels, got {c + 1}'):
        model(torch.rand(1, c + 1, 32, 32))
    with pytest.raises(ValueError, match=r'shape \(N, \d+, H, W\)'):
        model(torch.rand(c, 32, 32))
    with pytest.raises(TypeError, match='floating-point'):
        model(torch.zeros(1, c, 32, 32, dtype=torch.uint8))


def check_state_dict_roundtrip(cls, arch, tmp_path) -> None:
    """A saved model loads back through ``init_cfg=Pretrained`` to identical weights and outputs, and its
    checkpoint is recognised as this family (and only this one)."""
    model = _randomize(build(cls, arch), seed=5).eval()
    path = tmp_path / f'{cls.family}.pth'
    torch.save({'state_dict': model.state_dict()}, path)
    other = build(cls, arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    other.init_weights()
    other.eval()
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    x = torch.randn(1, model.in_channels, 40, 40)
    with torch.no_grad():
        for o, r in zip(other(x), model(x)):
            assert torch.equal(o, r)
    assert detect_family(model.state_dict()) is cls


def check_layer_depths(cls, arch, model: BaseBackbone | None = None) -> None:
    """Layer-wise decay depths: stem 0, every parameter in range, non-decreasing through the stages."""
    model = model if model is not None else build(cls, arch)
    top = model.num_layers - 1
    depths = {n: model.layer_depth(n) for n, _ in model.named_parameters()}
    assert all(0 <= d < top for d in depths.values()), depths
    assert all(depths[n] == 0 for n, p in model.named_parameters()
               if any(p is q for m in model.stem_modules() for q in m.parameters()))
    per_stage = []
    for i in range(model.num_stages):
        ids = {id(p) for m in model.stage_modules(i) for p in m.parameters()}
        per_stage.append([d for n, d in depths.items() if id(dict(model.named_parameters())[n]) in ids])
    for a, b in zip(per_stage, per_stage[1:]):
        assert max(a) <= min(b), 'depth must not decrease from one stage to the next'
    assert model.layer_depth('not.a.parameter') == top


ALL_CHECKS = [check_declared_shapes, check_empty_batch, check_freezing, check_norm_eval, check_reduced_precision,
              check_bad_input, check_layer_depths, check_grad_strides]
