"""The tools end to end: demo data, missing datasets, --help, converters, FLOPs, benchmark, short training,
kill-and-resume, tools/test.py on a trained checkpoint, 2-process CPU data parallel."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import FP32_PARITY, rel_err, with_env_dump

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
DEMO_DET = 'configs/demo/swiftformer_xs_maskrcnn_shapes.py'
DEMO_SEG = 'configs/demo/swiftformer_xs_semfpn_shapes.py'


def run(*args, timeout=900, env=None, check=True):
    out = subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    if check and out.returncode != 0:
        raise AssertionError(f'{args} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}')
    return out


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob('*')):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope='module')
def demo_data(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo')
    run('tools/make_demo_data.py', '--root', str(root), '--num-train', '48', '--num-val', '16')
    return root


def _data_opts(root: Path, kind: str) -> list[str]:
    sub = 'shapes_coco/' if kind == 'det' else 'shapes_ade/'
    opts = [f'train_dataloader.dataset.data_root={root / sub}', f'val_dataloader.dataset.data_root={root / sub}',
            f'test_dataloader.dataset.data_root={root / sub}']
    if kind == 'det':
        ann = root / sub / 'annotations/instances_val.json'
        opts += [f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']
    return opts


def test_demo_data_is_deterministic(tmp_path, demo_data):
    from mmplugin.demo import make_instance_dataset, make_semantic_dataset
    make_instance_dataset(str(tmp_path / 'a' / 'shapes_coco'), 48, 16, seed=0)
    make_semantic_dataset(str(tmp_path / 'a' / 'shapes_ade'), 48, 16, seed=1)
    assert _digest(tmp_path / 'a') == _digest(demo_data)
    make_instance_dataset(str(tmp_path / 'b'), 4, 2, seed=5)
    make_instance_dataset(str(tmp_path / 'c'), 4, 2, seed=6)
    assert _digest(tmp_path / 'b') != _digest(tmp_path / 'c')
    from pycocotools.coco import COCO
    coco = COCO(str(demo_data / 'shapes_coco/annotations/instances_train.json'))
    assert len(coco.getImgIds()) == 48 and len(coco.getAnnIds()) >= 48
    ann = coco.loadAnns(coco.getAnnIds())[0]
    assert coco.annToMask(ann).sum() == ann['area']  # masks are exact


@pytest.mark.parametrize('tool', ['train.py', 'test.py', 'infer.py', 'convert_checkpoint.py', 'get_flops.py',
                                  'benchmark.py', 'make_demo_data.py', 'speed_table.py', 'export.py'])
def test_help(tool):
    out = run(f'tools/{tool}', '--help', timeout=120)
    assert 'usage' in out.stdout.lower()


def test_speed_table_rows(capsys):
    """One row per peer and the plugin (as it is, and prepacked as --fast runs it), and the plugin's GEMM-only row;
    rows of implementations computing the same function carry their error against the plugin's eager fp32 outputs
    (< conftest.FP32_PARITY); the plugin's rows carry their time over the GEMM-only time, which is the sum of its
    GEMMs (so below the forward's)."""
    from mmplugin.cli import speed_table
    rows, whole, train, detector = speed_table.main(['--size', '64x96', '--rounds', '1', '--runtimes', 'eager',
                                                     '--models', 'swin:tiny', '--bf16', 'off'])
    by_impl = {r['impl']: r for r in rows}
    assert set(by_impl) == {'GEMMs alone', 'mmdet-swin', 'mmplugin', 'mmplugin prepacked'}
    assert not whole and not train and not detector
    assert by_impl['mmplugin prepacked']['rel_err'] < FP32_PARITY  # --fast's packed weights: the same function
    assert by_impl['mmdet-swin']['ratio'] == 1.0  # the first peer is the baseline
    assert by_impl['mmdet-swin']['rel_err'] < FP32_PARITY  # mmdet's Swin with the plugin's weights: the same function
    assert by_impl['mmplugin']['rel_err'] == 0.0
    gemm = by_impl['GEMMs alone']['seconds']
    assert by_impl['mmplugin']['gemm_ratio'] == pytest.approx(by_impl['mmplugin']['seconds'] / gemm)
    assert by_impl['mmdet-swin']['gemm_ratio'] is None  # only the plugin's own GEMMs are timed
    out = capsys.readouterr().out
    assert 'CPU: ' in out and 'command: python tools/speed_table.py' in out and out.count('| swin tiny') == 4


@pytest.mark.heavy
def test_speed_table_training_rows(capsys):
    """--train: one timed training step per implementation of the same function (mmdet's Swin first) and the
    plugin's GEMM-only step, then peak memory of a step in fresh processes, the plugin's with and without activation
    checkpointing, as ratios to the first. Where oneDNN serves the plugin's fp32 training linears, the same step with
    them on BLAS is timed beside it, and on Intel CPUs, where BLAS serves them (but thin linears' forward products), the
    same step all on oneDNN (what the kernel choice is worth)."""
    from mmplugin.analysis.speed import BLAS_ROW, ONEDNN_ROW
    from mmplugin.cli import speed_table
    from mmplugin.models.layers import gemm
    _, _, train, _ = speed_table.main(['--size', '64x96', '--rounds', '1', '--runtimes', 'eager', '--models',
                                    'swin:tiny', '--bf16', 'off', '--train', '64x96'])
    timed = [r for r in train if r['seconds'] is not None]
    gemms = 'GEMMs alone (forward + both gradients)'
    blas = [BLAS_ROW if gemm._ENABLED else ONEDNN_ROW] if gemm._AVAILABLE else []
    assert [r['impl'] for r in timed] == ['mmdet-swin', 'mmplugin', *blas, gemms] and timed[0]['ratio'] == 1.0
    # the plugin's step over its own GEMM-only step, timed in the same rounds; no such ratio for a peer
    assert timed[1]['gemm_ratio'] == pytest.approx(timed[1]['seconds'] / timed[-1]['seconds'])
    assert timed[0]['gemm_ratio'] is None and timed[-1]['gemm_ratio'] == 1.0
    assert timed[0]['ratio'] * timed[0]['seconds'] == pytest.approx(timed[-2]['ratio'] * timed[-2]['seconds'])
    mem = {r['impl']: r for r in train if r['peak_mib'] is not None}
    # mmdet's SwinTransformer takes with_cp only as a constructor argument (analysis.memory.supports_checkpointing)
    assert set(mem) == {'mmdet-swin', 'mmplugin', 'mmplugin with_cp'}
    assert mem['mmdet-swin']['mem_ratio'] == 1.0 and all(r['peak_mib'] > 0 for r in mem.values())
    assert 'backbone training step (batch 2, 64x96, AdamW)' in capsys.readouterr().out


def test_training_rows_compiled_step(monkeypatch, capsys):
    """``compiled``: the plugin's step under ``torch.compile`` joins the same rounds, one inductor-compiled copy per
    precision (the eager model itself is never compiled), with its time over the plugin's GEMM-only step. The
    compiler is replaced by a recorder here (compiling a Swin-T training graph takes minutes); the benchmark runs
    the real one."""
    import torch

    from mmplugin.analysis import peers, speed
    compiled, built = [], {}

    def record(model, backend=None, **kwargs):
        compiled.append((model, backend))
        return model

    def models(*args, plain=peers.benchmark_models):
        built.update(plain(*args))
        return built
    monkeypatch.setattr(torch, 'compile', record)
    monkeypatch.setattr(peers, 'benchmark_models', models)
    rows = speed.training_rows('swin', 'tiny', (32, 32), rounds=1, bf16=True, memory=False, compiled=True)
    by = {(r['impl'], r['precision']): r for r in rows}
    for precision in ('fp32', 'bf16 autocast'):
        row = by[(speed.COMPILED_ROW, precision)]
        gemm = by[('GEMMs alone (forward + both gradients)', precision)]['seconds']
        assert row['seconds'] > 0 and row['gemm_ratio'] == pytest.approx(row['seconds'] / gemm)
        assert row['ratio'] == pytest.approx(by[('mmdet-swin', precision)]['seconds'] / row['seconds'])
    assert [b for _, b in compiled] == ['inductor', 'inductor']
    assert compiled[0][0] is not compiled[1][0] and built['mmplugin'] not in {m for m, _ in compiled}  # copies
    assert all(m.training for m, _ in compiled)
    assert capsys.readouterr().out.count('training step compiled') == 2


@pytest.mark.heavy
def test_speed_table_detector_training_rows(capsys):
    """--train-detector: a whole Swin-T Mask R-CNN step as the plugin's config builds it (its backbone, its RoIAlign)
    and as mmdet's builds it (mmdet's SwinTransformer carrying the same weights, mmcv's RoIAlign; neck and heads
    copied, the same batch and sampling), and the plugin's backbone with mmcv's RoIAlign between them. All compute the
    same function: the first step's RPN losses (which depend on the backbone + neck outputs, not on the proposals)
    agree to fp32 rounding. Peak memory of a step of mmdet's, the plugin's, and the plugin's with activation
    checkpointing, in fresh processes."""
    from mmplugin.analysis.detector_step import BACKBONE_ONLY
    from mmplugin.cli import speed_table
    *_, rows = speed_table.main(['--models', '--rounds', '1', '--train-detector',
                                 'configs/swin/swin_t_maskrcnn_1x_coco.py@96x128'])
    by = {r['impl']: r for r in rows}
    assert list(by) == ['mmdet-swin', BACKBONE_ONLY, 'mmplugin', 'mmplugin with_cp']
    theirs = by['mmdet-swin']['losses']
    for ours in (by['mmplugin']['losses'], by[BACKBONE_ONLY]['losses']):
        for k in ('loss_rpn_cls', 'loss_rpn_bbox'):
            assert abs(ours[k] - theirs[k]) <= 1e-4 * abs(theirs[k]), (k, ours[k], theirs[k])
    assert by['mmdet-swin']['ratio'] == 1.0 and by['mmplugin']['seconds'] > 0
    assert by[BACKBONE_ONLY]['peak_mib'] is None and by[BACKBONE_ONLY]['seconds'] > 0
    assert by['mmdet-swin']['mem_ratio'] == 1.0 and all(r['peak_mib'] > 0 for r in rows if r['impl'] != BACKBONE_ONLY)
    assert '| swin_t_maskrcnn_1x_coco.py (batch 2, 96x128) | mmplugin |' in capsys.readouterr().out


def test_missing_dataset_is_reported_before_building(tmp_path):
    t = time.time()
    out = run('tools/train.py', 'configs/swiftformer/swiftformer_l1_maskrcnn_1x_coco.py', '--work-dir', str(tmp_path),
              check=False)
    assert out.returncode == 2
    assert 'data/coco/annotations/instances_train2017.json' in out.stderr
    assert 'cocodataset.org' in out.stderr and 'Traceback' not in out.stderr
    assert 'SwiftFormer' not in out.stdout  # no model was built
    out = run('tools/train.py', 'configs/swin/swin_t_upernet_160k_ade20k.py', '--work-dir', str(tmp_path), check=False)
    assert out.returncode == 2 and 'ADEChallengeData2016' in out.stderr
    assert time.time() - t < 120


def test_convert_checkpoint_cli(tmp_path):
    from mmplugin.models import SwiftFormer
    from mmplugin.reference.swiftformer import ReferenceSwiftFormer
    ref = ReferenceSwiftFormer([3, 3, 6, 4], [48, 56, 112, 220])
    sd = ref.state_dict()
    sd['head.weight'] = torch.zeros(1000, 220)
    src, dst = tmp_path / 'official.pth', tmp_path / 'plugin.pth'
    torch.save({'model': sd}, src)
    out = run('tools/convert_checkpoint.py', str(src), str(dst), timeout=300)
    assert 'swiftformer: wrote' in out.stdout and 'head.weight' in out.stdout
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    model.init_weights()
    assert torch.equal(model.state_dict()['stages.3.blocks.3.attn.proj.weight'], sd['network.6.3.attn.Proj.weight'])
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(b'garbage')
    out = run('tools/convert_checkpoint.py', str(bad), str(tmp_path / 'x.pth'), check=False, timeout=300)
    assert out.returncode == 2 and 'not a readable PyTorch checkpoint' in out.stderr


def test_get_flops_swiftformer():
    out = run('tools/get_flops.py', '--family', 'swiftformer', '--sizes', '224x224', timeout=600)
    rows = {m.group(1): (int(m.group(2).replace(',', '')), float(m.group(3)))
            for m in re.finditer(r'swiftformer-(\w+)\s+([\d,]+)\s+([\d.]+)', out.stdout)}
    assert rows['xs'][0] == 3_033_792 and rows['l3'][0] == 27_469_760
    paper = {'xs': 0.6, 's': 1.0, 'l1': 1.6, 'l3': 4.0}  # SwiftFormer Table 4 (with the classifier)
    for arch, gmacs in paper.items():
        assert abs(rows[arch][1] - gmacs) <= 0.1 * gmacs, (arch, rows[arch])


@pytest.mark.heavy
def test_benchmark_runs_and_plots(tmp_path):
    png = tmp_path / 'bench.png'
    out = run('tools/benchmark.py', 'swiftformer', '--arch', 'xs', '--sizes', '64x64', '96x128', '--rounds', '1',
              '--plot', str(png), timeout=600)
    assert re.search(r'mmplugin-deploy\s+[\d.]+x', out.stdout) and png.stat().st_size > 1000
    js = tmp_path / 'swin.json'
    out = run('tools/benchmark.py', 'swin', '--arch', 'tiny', '--sizes', '64x64', '--rounds', '1', '--json', str(js),
              timeout=600)
    import json
    times = json.loads(js.read_text())['sizes']['64x64']
    assert list(times)[:2] == ['mmdet-swin', 'mmplugin']
    printed = float(re.search(r'mmplugin\s+([\d.]+)x', out.stdout).group(1))
    assert printed == pytest.approx(times['mmdet-swin'] / times['mmplugin'], abs=0.006)


def test_benchmark_peers_share_the_weights():
    """A speed ratio is only meaningful between equal computations: the peers compute the same function."""
    from mmplugin import analysis
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        swin = analysis.benchmark_models('swin', 'tiny', torch.device('cpu'))
        for a, b in zip(swin['mmdet-swin'](x), swin['mmplugin'](x)):
            assert rel_err(a, b) < FP32_PARITY
        sf = analysis.benchmark_models('swiftformer', 'xs', torch.device('cpu'))
        ref = sf['official'](x)
        for name in ('mmplugin', 'mmplugin-deploy'):
            for a, b in zip(sf[name](x), ref):
                assert rel_err(a, b) < FP32_PARITY, name


@pytest.mark.slow
def test_short_training_learns(tmp_path, demo_data):
    work = tmp_path / 'det'
    out = run('tools/train.py', DEMO_DET, '--work-dir', str(work), '--cfg-options', *_data_opts(demo_data, 'det'),
              'train_cfg.max_iters=60', 'train_cfg.val_interval=60', 'default_hooks.checkpoint.interval=60',
              'default_hooks.logger.interval=10', timeout=1500)
    losses = [float(v) for v in re.findall(r'Iter\(train\).*?\sloss: ([\d.]+)', out.stdout + out.stderr)]
    assert len(losses) >= 5 and losses[-1] < 0.6 * losses[0], losses
    ap = re.findall(r'coco/bbox_mAP_50: ([\d.]+)', out.stdout + out.stderr)
    assert ap and float(ap[-1]) > 0.0, ap
    # the trained detector evaluated eagerly and with backbone + neck in OpenVINO: AP within 0.001
    aps = {}
    for runtime in ('pytorch', 'openvino'):
        res = run('tools/test.py', DEMO_DET, str(work / 'iter_60.pth'), '--work-dir', str(tmp_path / runtime),
                  '--runtime', runtime, '--cfg-options', *_data_opts(demo_data, 'det'), timeout=900)
        aps[runtime] = float(re.search(r"'coco/bbox_mAP': ([\d.]+)", res.stdout).group(1))
    assert aps['pytorch'] > 0 and abs(aps['openvino'] - aps['pytorch']) <= 0.001, aps


@pytest.mark.slow
def test_compiled_backbone_trains_like_eager(tmp_path, demo_data):
    """--compile-backbone: the same first iterations as eager training (fixed 160x160 crops, one graph), losses equal
    to fp32 rounding (both are fp32 computations of the same function from the same weights and batches; over four
    iterations they stay within the fp32 parity bound), and checkpoints with the eager state dict keys."""
    from mmplugin.checkpoint import load_checkpoint_file
    losses, keys = {}, {}
    for mode in ('eager', 'compiled'):
        work = tmp_path / mode
        flag = ['--compile-backbone'] if mode == 'compiled' else []
        out = run('tools/train.py', DEMO_SEG, '--work-dir', str(work), *flag,
                  '--cfg-options', *_data_opts(demo_data, 'seg'), 'train_cfg.max_iters=4', 'train_cfg.val_interval=4',
                  'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=4', timeout=900)
        assert ('SwiftFormer compiled (inductor)' in out.stdout) == (mode == 'compiled')
        rows = [json.loads(line) for line in next(work.rglob('scalars.json')).read_text().splitlines()]
        losses[mode] = [r['loss'] for r in rows if 'loss' in r]
        keys[mode] = sorted(load_checkpoint_file(work / 'iter_4.pth')['state_dict'])
    assert len(losses['eager']) == 4 and len(losses['compiled']) == 4
    for a, b in zip(losses['compiled'], losses['eager']):
        assert rel_err(torch.tensor(a), torch.tensor(b)) <= FP32_PARITY, (losses['compiled'], losses['eager'])
    assert keys['compiled'] == keys['eager'] and not any('_orig_mod' in k for k in keys['compiled'])


def _spawn_train(args, log):
    return subprocess.Popen([PY, 'tools/train.py', *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_kill_and_resume_then_test(tmp_path, demo_data):
    work = tmp_path / 'seg'
    args = [DEMO_SEG, '--work-dir', str(work), '--cfg-options', *_data_opts(demo_data, 'seg'),
            'train_cfg.max_iters=24', 'train_cfg.val_interval=24', 'default_hooks.checkpoint.interval=6',
            'default_hooks.checkpoint.max_keep_ckpts=10', 'train_dataloader.batch_size=2']
    with open(tmp_path / 'first.log', 'w') as log:
        proc = _spawn_train(args, log)
        deadline = time.time() + 600
        while not (work / 'iter_6.pth').exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert (work / 'iter_6.pth').exists(), (tmp_path / 'first.log').read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (work / 'iter_24.pth').exists()
    for p in work.glob('*.pth'):  # whatever was on disk at the kill is a complete checkpoint
        with zipfile.ZipFile(p) as z:
            assert z.testzip() is None, p
    out = run('tools/train.py', *args, '--resume', timeout=900)
    resumed = re.search(r'resuming from .*iter_(\d+)\.pth', out.stdout)
    assert resumed and int(resumed.group(1)) >= 6, out.stdout[-2000:]  # continued, did not restart from zero
    from mmplugin.checkpoint import load_checkpoint_file
    final = load_checkpoint_file(work / 'iter_24.pth')
    assert final['meta']['iter'] == 24
    # tools/test.py evaluates what tools/train.py wrote (weights-only loading on torch >= 2.6)
    out = run('tools/test.py', DEMO_SEG, str(work / 'iter_24.pth'), '--work-dir', str(tmp_path / 'test'),
              '--cfg-options', *_data_opts(demo_data, 'seg'), timeout=600)
    miou = float(re.search(r"'mIoU': ([\d.]+)", out.stdout).group(1))
    # --fast bf16: backbone + neck in bf16 (emulated on CPUs without AVX512-BF16, so only the cost is measured)
    out = run('tools/test.py', DEMO_SEG, str(work / 'iter_24.pth'), '--work-dir', str(tmp_path / 'test_bf16'),
              '--fast', 'bf16', '--cfg-options', *_data_opts(demo_data, 'seg'), timeout=900)
    miou_bf16 = float(re.search(r"'mIoU': ([\d.]+)", out.stdout).group(1))
    assert '--fast bf16: backbone + neck in torch.bfloat16' in out.stdout
    assert abs(miou_bf16 - miou) <= 5.0, (miou, miou_bf16)  # a 24-iteration model: many pixels near a tie
    # --runtime openvino: backbone + neck in OpenVINO (fp32), decode head in PyTorch: the metric of eager within
    # 0.1 mIoU (only fp32 rounding differs; pixels exactly at a tie may flip)
    out = run('tools/test.py', DEMO_SEG, str(work / 'iter_24.pth'), '--work-dir', str(tmp_path / 'test_ov'),
              '--runtime', 'openvino', '--cfg-options', *_data_opts(demo_data, 'seg'), timeout=900)
    assert '--runtime openvino: backbone + neck in openvino (f32' in out.stdout
    assert abs(float(re.search(r"'mIoU': ([\d.]+)", out.stdout).group(1)) - miou) <= 0.1, out.stdout[-2000:]
    png = tmp_path / 'seg.png'
    out = run('tools/infer.py', DEMO_SEG, str(work / 'iter_24.pth'),
              str(demo_data / 'shapes_ade/images/validation/00000.png'), '--out', str(png), '--fast', timeout=600)
    assert png.stat().st_size > 1000 and 'visualisation written' in out.stdout
    from mmplugin.inference.fast import native_low_precision
    if native_low_precision('cpu') is None:  # --fast (auto) on a CPU without bf16 kernels: says it runs fp32
        assert 'running fp32' in out.stderr, out.stderr[-2000:]
        assert '--fast auto: backbone + neck in torch.float32' in out.stdout


def test_resume_skips_truncated_latest_checkpoint(tmp_path):
    from mmplugin.cli.runner import find_resumable_checkpoint
    good = tmp_path / 'iter_10.pth'
    torch.save({'meta': {'iter': 10}}, good)
    bad = tmp_path / 'iter_20.pth'
    bad.write_bytes(good.read_bytes()[:50])
    (tmp_path / 'last_checkpoint').write_text(str(bad))
    assert find_resumable_checkpoint(str(tmp_path)) == str(good)
    (tmp_path / 'last_checkpoint').write_text('')
    assert find_resumable_checkpoint(str(tmp_path)) == str(good)


@pytest.mark.slow
def test_two_process_cpu_ddp_with_frozen_stages(tmp_path, demo_data):
    work = tmp_path / 'ddp'
    out = subprocess.run(
        ['bash', 'tools/dist_train.sh', DEMO_SEG, '2', '--work-dir', str(work), '--cfg-options',
         *_data_opts(demo_data, 'seg'),
         'model.backbone.frozen_stages=2', 'train_cfg.max_iters=4', 'train_cfg.val_interval=100',
         'default_hooks.checkpoint.interval=4', 'default_hooks.logger.interval=1', 'train_dataloader.batch_size=2'],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, 'PYTHON': PY, 'PORT': '29533'})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert 'distributed training: true' in with_env_dump(log, work).lower(), log[-3000:]
    assert (work / 'iter_4.pth').exists()
    assert 'Expected to have finished reduction' not in log


def test_interleaved_timing_alternates_and_takes_the_median(monkeypatch):
    """One warm-up per function, then rounds that call each function once in turn; the median of the rounds."""
    import mmplugin.utils.timing as timing
    calls, clock = [], iter([0.0, 1.0, 1.0, 3.0, 3.0, 3.5, 3.5, 7.5, 7.5, 8.5, 8.5, 8.75])
    monkeypatch.setattr(timing.time, 'perf_counter', lambda: next(clock))
    got = timing.interleaved({'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}, rounds=3)
    assert calls == ['a', 'b'] + ['a', 'b'] * 3
    assert got == {'a': 1.0, 'b': 2.0}  # a: 1, 0.5, 1 -> 1; b: 2, 4, 0.25 -> 2
    with pytest.raises(ValueError, match='rounds'):
        timing.interleaved({'a': lambda: None}, rounds=0)
