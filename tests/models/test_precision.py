"""Every precision and every device: fp16 and bf16 (autocast and whole models cast with ``.to(dtype)``) against
fp32 within the bounds of mmplugin.testing.numeric, models planned on the ``meta`` device, mixed-precision
training through ``mmplugin.AmpOptimWrapper`` on the CPU, and a compiled Swin V2 training step."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_PARITY, rel_err

from mmplugin.models import SwiftFormer, SwinTransformer, SwinTransformerV2
from mmplugin.testing.numeric import FP16_VS_FP32, REDUCED_VS_FP32, U_FP16

LOW = {'fp16': torch.float16, 'bf16': torch.bfloat16}


def test_fp16_bound_is_derived_like_bf16():
    assert FP16_VS_FP32 == pytest.approx(2 * U_FP16 * 50**0.5)
    assert REDUCED_VS_FP32['fp16'] < REDUCED_VS_FP32['bf16']


@pytest.mark.numeric
@pytest.mark.parametrize('mode', ['autocast', 'model'])
@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
@pytest.mark.parametrize('size', [(224, 224), (100, 140)])
def test_swin_v2_tiny_reduced_precision_is_finite_and_close(size, dtype, mode):
    """The full Swin V2-T (window 8): at 224 the stage-2 map (14x14) is padded to 16x16, at 100x140 every stage is
    padded. fp16 used to give NaN there (the zero padding tokens were L2-normalised in fp16, whose 1e-12 epsilon
    is 0); every level is now finite and within the precision's bound of fp32 (default init, inputs up to 1e3). The
    post-norms' weights are set to one: V2's initialisation zeroes them, and a block's attention and MLP would then
    add nothing to its output."""
    torch.manual_seed(0)
    model = SwinTransformerV2('tiny', drop_path_rate=0.0).eval()
    for name, p in model.named_parameters():
        if '.norm' in name and name.endswith('.weight'):
            p.data.fill_(1.0)
    low = LOW[dtype]
    for scale in (1.0, 1e3):
        x = torch.randn(1, 3, *size) * scale
        with torch.no_grad():
            ref = model(x)
            if mode == 'autocast':
                with torch.autocast('cpu', dtype=low):
                    got = model(x)
            else:
                got = model.to(low)(x.to(low))
                model.float()
        for i, (o, r) in enumerate(zip(got, ref)):
            assert o.dtype == low if mode == 'model' else o.dtype in (low, torch.float32)
            assert torch.isfinite(o).all(), f'level {i} not finite'
            assert rel_err(o, r) < REDUCED_VS_FP32[dtype], (i, rel_err(o, r))


@pytest.mark.numeric
def test_v2_zero_padding_tokens_normalise_to_zero_in_fp16():
    """The cosine attention of a window holding zero (padding) tokens: fp16 q / k of those tokens are 0, not NaN,
    as ``F.normalize`` gives in fp32; the fp32 path is bit-identical to ``F.normalize``."""
    from mmplugin.models.layers.precision import fp32_normalize
    x = torch.randn(4, 3, 64, 32)
    x[:, :, 40:] = 0
    assert torch.equal(fp32_normalize(x), torch.nn.functional.normalize(x, dim=-1))
    s = torch.full((3, 1, 1), 100.0)
    assert torch.equal(fp32_normalize(x, scale=s), torch.nn.functional.normalize(x, dim=-1) * s)
    for dtype in LOW.values():
        y = fp32_normalize(x.to(dtype) * 300, scale=s)  # squares of 300 overflow fp16: the norm is taken in fp32
        assert y.dtype == dtype and torch.isfinite(y).all()
        assert torch.equal(y[:, :, 40:], torch.zeros_like(y[:, :, 40:]))
        assert rel_err(y, torch.nn.functional.normalize(x, dim=-1) * s) < 2 * 2.0**-8


def _families():
    return [SwinTransformer(dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]), drop_path_rate=0.),
            SwinTransformerV2(dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]), drop_path_rate=0.),
            SwiftFormer(dict(depths=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48]), drop_path_rate=0.)]


@pytest.mark.parametrize('train', [False, True])
def test_every_backbone_and_neck_runs_on_the_meta_device(train):
    """Planned without memory (``torch.device('meta')``): no tensor is made on the CPU inside a forward and nothing
    asks the device type for a feature it lacks (autocast). Shapes equal the CPU run's."""
    from mmplugin.models.necks.global_attention import GlobalAttentionNeck
    for model in _families():
        x = torch.randn(2, 3, 100, 140)
        with torch.no_grad():
            want = [o.shape for o in model.eval()(x)]
        meta = model.to('meta').train(train)
        got = meta(torch.empty(2, 3, 100, 140, device='meta'))
        assert [o.shape for o in got] == want
        assert all(o.device.type == 'meta' for o in got)
        neck = GlobalAttentionNeck(in_channels=list(model.out_channels), num_heads=2).to('meta').train(train)
        outs = neck(list(got))
        assert [o.shape for o in outs] == want and all(o.device.type == 'meta' for o in outs)


def test_amp_optim_wrapper_on_the_cpu():
    """``mmplugin.AmpOptimWrapper`` is mmengine's wrapper on any device: fp16 autocast with dynamic loss scaling
    (the scaled loss's gradients are unscaled before the step: the update equals plain AdamW on the same
    gradients), bf16 without scaling, the ``loss_scaler`` state in the state dict; bad arguments are refused."""
    from mmengine.optim import build_optim_wrapper
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict(lin.state_dict())
    wrapper = build_optim_wrapper(lin, dict(type='mmplugin.AmpOptimWrapper', dtype='float16',
                                            optimizer=dict(type='AdamW', lr=1e-2)))
    assert wrapper.loss_scaler.is_enabled() and wrapper.cast_dtype is torch.float16
    x = torch.randn(16, 8)
    with wrapper.optim_context(lin):
        y = lin(x)
        assert y.dtype is torch.float16
    loss = y.float().pow(2).mean()
    wrapper.update_params(loss)
    with torch.autocast('cpu', dtype=torch.float16):
        ref_loss = ref(x).float().pow(2).mean()
    ref_loss.backward()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt.step()
    assert rel_err(lin.weight, ref.weight) < FP32_PARITY
    assert 'loss_scaler' in wrapper.state_dict() and wrapper.state_dict()['loss_scaler']['scale'] > 1
    bf = build_optim_wrapper(lin, dict(type='mmplugin.AmpOptimWrapper', optimizer=dict(type='AdamW', lr=1e-2)))
    assert bf.cast_dtype is torch.bfloat16 and not bf.loss_scaler.is_enabled()  # CPU default: bf16, no scaling
    with pytest.raises(ValueError, match='dtype must be'):
        build_optim_wrapper(lin, dict(type='mmplugin.AmpOptimWrapper', dtype='float64',
                                      optimizer=dict(type='AdamW', lr=1e-2)))
    with pytest.raises(TypeError, match='loss_scale must be'):
        build_optim_wrapper(lin, dict(type='mmplugin.AmpOptimWrapper', loss_scale='static',
                                      optimizer=dict(type='AdamW', lr=1e-2)))


def test_amp_config_trains_in_its_precision_on_the_cpu(capsys):
    """``--amp`` / ``--amp-dtype`` and a config's ``AmpOptimWrapper`` select ``mmplugin.AmpOptimWrapper`` without
    a GPU (they used to fall back to fp32); the dtype given wins; another wrapper type is refused."""
    from mmengine.config import Config

    from mmplugin.cli.runner import prepare_amp
    if torch.cuda.is_available():
        pytest.skip('with CUDA, mmengine\'s own AmpOptimWrapper is used')
    cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4))))
    prepare_amp(cfg, amp=True, dtype=None)
    assert cfg.optim_wrapper.type == 'mmplugin.AmpOptimWrapper' and 'bfloat16 autocast' in capsys.readouterr().out
    cfg = Config(dict(optim_wrapper=dict(type='AmpOptimWrapper', loss_scale=512.0, optimizer=dict(type='SGD'))))
    prepare_amp(cfg, amp=False, dtype='float16')
    assert (cfg.optim_wrapper.type, cfg.optim_wrapper.dtype, cfg.optim_wrapper.loss_scale) == (
        'mmplugin.AmpOptimWrapper', 'float16', 512.0)
    assert 'float16 autocast with dynamic loss scaling' in capsys.readouterr().out
    plain = Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD'))))
    prepare_amp(plain, amp=False)
    assert plain.optim_wrapper.type == 'OptimWrapper'
    with pytest.raises(ValueError, match='not an OptimWrapper'):
        prepare_amp(Config(dict(optim_wrapper=dict(type='ApexOptimWrapper', optimizer=dict(type='SGD')))), True)


@pytest.mark.slow
def test_swin_v2_cascade_config_takes_fp16_amp_steps():
    """The Swin V2-T Cascade Mask R-CNN config (an AmpOptimWrapper config) with fp16 AMP on 96x96 images: finite
    losses at every step; dynamic loss scaling skips the steps whose scaled gradients overflow (halving the scale,
    weights untouched) until one is applied, which changes the weights and leaves every parameter finite."""
    from conftest import CONFIGS, _build, _det_batch, _fewer_rois
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper

    from mmplugin.cli.runner import prepare_amp
    cfg = Config.fromfile(str(CONFIGS / 'swinv2/swinv2_t_cascade_maskrcnn_3x_coco.py'))
    cfg.model.backbone.init_cfg = None
    prepare_amp(cfg, amp=True, dtype='float16')
    _fewer_rois(cfg, rois=16)  # CPUs without fp16 kernels emulate the heads' fp16 convolutions: few RoIs
    model = revert_sync_batchnorm(_build(cfg)).train()
    model.init_weights()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    weight = model.backbone.layers[0].blocks[0].attn.qkv.weight
    before = weight.detach().clone()
    data = _det_batch(model)
    for step in range(12):
        scale = optim.loss_scaler.get_scale()
        losses = model.train_step(data, optim)
        assert torch.isfinite(sum(v for k, v in losses.items() if 'loss' in k)), losses
        if not torch.equal(before, weight):
            break
        assert optim.loss_scaler.get_scale() == scale / 2  # a skipped step: the scale halves
    assert not torch.equal(before, weight), 'no fp16 step was applied in 12 iterations'
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the applied (unscaled) update was finite


@pytest.mark.slow
def test_compiled_swin_v2_training_step_equals_eager():
    """``torch.compile`` (inductor, CPU) of a Swin V2 forward + backward at a padded, shifted size: loss and every
    gradient equal eager within fp32 rounding."""
    torch.manual_seed(0)
    from conftest import randomize_
    # two blocks (regular + shifted windows) where the maps are padded and shifted, one in the last two stages: the
    # compile time grows with the blocks
    eager = randomize_(SwinTransformerV2(dict(embed_dims=16, depths=[2, 2, 1, 1], num_heads=[1, 2, 2, 4]),
                                         drop_path_rate=0.), seed=3).train()
    import copy
    compiled_model = copy.deepcopy(eager)
    step = torch.compile(lambda m, x: sum(o.pow(2).mean() for o in m(x)), fullgraph=False)
    x = torch.randn(2, 3, 72, 88)
    want = sum(o.pow(2).mean() for o in eager(x))
    want.backward()
    got = step(compiled_model, x)
    got.backward()
    assert rel_err(got, want) < FP32_PARITY
    for (n, p), (_, q) in zip(eager.named_parameters(), compiled_model.named_parameters()):
        assert rel_err(q.grad, p.grad) < FP32_PARITY, n


def test_gpu_check_runs_its_checks_on_the_cpu(tmp_path):
    """``tools/gpu_check.py --cpu-smoke`` goes through every check of the GPU script on the CPU (so the script a
    lent GPU runs is known to work): precision per family, the deterministic backward, SDPA, a training step."""
    import json

    from mmplugin.cli.gpu_check import main
    out = tmp_path / 'report.json'
    assert main(['--cpu-smoke', '--json', str(out)]) == 0
    report = json.loads(out.read_text())
    assert {'swin', 'swinv2', 'swiftformer'} <= set(report['precision'])
    assert all(v == 'ok' for k, v in report['precision'].items() if k != 'swinv2-tiny-full'), report['precision']
    assert report['deterministic'] == 'bit-identical'
    # the speed table's backbone rows: the plugin beside its peers and its GEMMs alone, every precision asked for
    from mmplugin.testing.numeric import BF16_VS_FP32, FP32_PARITY
    for spec, entry in report['backbones'].items():
        rows = entry['inference']
        for prec, bound in (('fp32', FP32_PARITY), ('bf16 autocast', BF16_VS_FP32)):
            mine = [r for r in rows if r['impl'] == 'mmplugin' and r['precision'] == prec]
            assert len(mine) == 1 and mine[0]['gemm_ratio'] > 0, (spec, prec)
            assert [r for r in rows if r['impl'] == 'GEMMs alone' and r['precision'] == prec]
            for r in rows:  # the peers compute the same function with the same weights
                if r['precision'] == prec and r['rel_err'] is not None:
                    assert r['rel_err'] < bound, (spec, r)
        assert {r['impl'] for r in entry['training']} >= {'mmplugin', 'mmplugin with_cp'}, spec
    assert {'mmdet-swin', 'mmdet-swin with_cp'} <= {r['impl'] for r in report['backbones']['swin:tiny']['training']}
    # CPU inference and fp32 training: the plugin's fused kernel (SDPA or the explicit products, softmax + bmm,
    # where it cannot be built)
    from mmplugin.ops.window_attention import available
    for mode in ('fp32 eval', 'fp32 train'):
        ops = report['backbones']['swin:tiny']['attention'][mode]
        assert (ops == ['mmplugin::window_attention'] if available()
                else any('softmax' in op or 'scaled_dot_product' in op for op in ops)), (mode, ops)
    # the whole detector step, plugin backbone against mmdet's: the same first-step losses (same weights, sampling)
    pair = {r['impl']: r for r in report['detector_pair']}
    assert set(pair) == {'mmdet-swin', 'mmplugin', 'mmplugin with_cp'}
    theirs, ours = pair['mmdet-swin']['losses'], pair['mmplugin']['losses']
    assert all(math.isfinite(v) for v in (*theirs.values(), *ours.values())), (theirs, ours)
    for k in ('loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_mask'):
        assert abs(ours[k] - theirs[k]) <= 1e-4 * abs(theirs[k]), (k, ours[k], theirs[k])


@pytest.mark.parametrize('args, says', [(['--backbones', 'swin'], 'FAMILY:ARCH'),
                                        (['--backbones', 'resnet:50'], 'FAMILY:ARCH'),
                                        (['--backbones', 'swin:huge'], "unknown arch 'huge'"),
                                        (['--compile', 'fp8'], '--compile takes'),
                                        (['--rounds', '0'], 'must be >= 1'),
                                        (['--train-size', '512by768'], 'is not a size')])
def test_gpu_check_refuses_bad_arguments(args, says, capsys):
    """Every option is checked before anything runs: a clear message naming it, exit status 2."""
    from mmplugin.cli.gpu_check import main
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    from mmplugin.demo import make_instance_dataset, make_semantic_dataset
    root = tmp_path_factory.mktemp('amp_demo')
    make_instance_dataset(str(root / 'shapes_coco'), 24, 4, seed=0)
    make_semantic_dataset(str(root / 'shapes_ade'), 24, 4, seed=1)
    return root


@pytest.mark.slow
@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
@pytest.mark.parametrize('task', ['det', 'seg'])
def test_demo_models_train_amp_iterations_on_the_cpu(task, dtype, demo_root, tmp_path):
    """The demo detector / segmentor, ``tools/train.py --amp-dtype`` on the CPU: every loss is finite; every
    gradient norm is finite except fp16 steps skipped by the loss scaler (scaled gradients that overflowed). Each
    skip halves the scale from 2^16 and it grows back only after 2000 finite steps (torch's GradScaler defaults), so
    at most 16 of fp16's 30 iterations are skipped and the last is not; bf16 has no loss scaling and skips nothing,
    so 15 iterations show every one of its steps finite."""
    from pathlib import Path

    from mmengine.logging import MessageHub

    from mmplugin.cli.train import main
    root = Path(__file__).resolve().parents[2]
    config = str(root / ('configs/demo/swiftformer_xs_maskrcnn_shapes.py' if task == 'det'
                         else 'configs/demo/swiftformer_xs_semfpn_shapes.py'))
    sub = demo_root / ('shapes_coco' if task == 'det' else 'shapes_ade')
    opts = [f'{split}_dataloader.dataset.data_root={sub}' for split in ('train', 'val', 'test')]
    if task == 'det':
        ann = sub / 'annotations/instances_val.json'
        opts += [f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']
    iters = 30 if dtype == 'float16' else 15
    opts += [f'train_cfg.max_iters={iters}', 'train_cfg.val_interval=1000', 'train_dataloader.num_workers=0',
             'train_dataloader.persistent_workers=False', 'default_hooks.checkpoint.interval=1000',
             'train_dataloader.batch_size=1']  # 1 image a step: CPUs without fp16 / bf16 kernels emulate them
    if task == 'seg':  # the segmentor clips nothing; a bound no gradient reaches makes the wrapper log the norm
        opts += ['optim_wrapper.clip_grad.max_norm=1e12']
    assert main([config, '--work-dir', str(tmp_path), '--amp-dtype', dtype, '--cfg-options', *opts]) == 0
    hub = MessageHub.get_current_instance()
    losses = hub.get_scalar('train/loss').data[0]
    norms = hub.get_scalar('train/grad_norm').data[0]
    assert len(losses) == iters and len(norms) == iters
    assert all(torch.isfinite(torch.tensor(losses))), losses
    finite = torch.isfinite(torch.tensor(norms))
    assert int((~finite).sum()) <= (16 if dtype == 'float16' else 0) and finite[-1], norms
    if dtype == 'bfloat16':
        assert finite.all(), norms  # no loss scaling, nothing skipped


def test_training_after_inference_mode_at_the_same_size():
    """A forward under ``torch.inference_mode()`` fills the window-index caches; a training forward + backward at
    the same size afterwards must not receive inference tensors ("Inference tensors cannot be saved for
    backward"), for every Swin version."""
    from conftest import tiny_backbone
    for family in ('swin', 'swinv2'):
        model = tiny_backbone(family)
        x = torch.randn(1, 3, 84, 116)  # a size no other test uses: the caches start empty for it
        with torch.inference_mode():
            model(x)
        model.train()
        sum(o.pow(2).mean() for o in model(x)).backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.numeric
@pytest.mark.parametrize('mode', ['autocast', 'model'])
def test_fp16_token_score_norm_does_not_overflow(mode):
    """SwiftFormer normalises its token scores over the N tokens; in fp16 the sum of squares runs in fp32 (300 scores
    of 20 sum to 1.2e5, past fp16's 65504: a zero norm and all-zero weights otherwise), also under autocast, which
    would cast the fp32 product back to fp16: ``F.normalize`` in fp32, within fp16's bound."""
    from mmplugin.models.backbones.swiftformer.attention import l2_normalize
    scores = torch.full((2, 300, 1), 20.0)
    scores[1, :, 0] = torch.linspace(-30, 30, 300)
    ref = F.normalize(scores, dim=1)
    with torch.autocast('cpu', dtype=torch.float16, enabled=mode == 'autocast'):
        got = l2_normalize(scores.half(), dim=1)
    assert got.dtype == torch.float16 and rel_err(got.float(), ref) < FP16_VS_FP32
