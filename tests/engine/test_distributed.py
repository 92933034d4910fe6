"""Training beyond one machine on CPUs (gloo): two torchrun nodes joined by the c10d rendezvous on 127.0.0.1, what a
lost node does to the others, resuming on another world size, FSDP through mmengine's FlexibleRunner."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import with_env_dump

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
DEMO_SEG = ROOT / 'configs/demo/swiftformer_xs_semfpn_shapes.py'
BATCH = 2  # per process
BASE_LR = 2e-3  # the demo config's AdamW lr
WARMUP = 100  # LinearLR iterations in the test config; every run here stays inside them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def tiny_cfg(tmp_path_factory):
    """The SwiftFormer-XS Semantic FPN demo on 64 px images, no validation, checkpoints every 2 iterations, a linear
    lr ramp (so the lr says which iteration it belongs to) and mmengine's linear lr scaling for batch 4."""
    from mmplugin.demo.synthetic import make_semantic_dataset
    root = tmp_path_factory.mktemp('dist')
    data = root / 'shapes_ade'
    make_semantic_dataset(str(data), num_train=16, num_val=2, size=64, seed=1)
    cfg = root / 'tiny_seg.py'
    cfg.write_text(f"""
_base_ = [{str(DEMO_SEG)!r}]
model = dict(data_preprocessor=dict(size=(64, 64)))
train_dataloader = dict(batch_size={BATCH}, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root={str(data) + '/'!r}))
val_dataloader = None
val_cfg = None
val_evaluator = None
train_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=10 ** 6)
param_scheduler = [dict(type='LinearLR', start_factor=0.25, by_epoch=False, begin=0, end={WARMUP})]
auto_scale_lr = dict(enable=True, base_batch_size={2 * BATCH})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2, max_keep_ckpts=100))
""")
    return cfg


def _launch(cfg, work, nnodes, node_rank, port, *opts, log, extra=()):
    """One node: tools/dist_train.sh with one process, in its own process group (so the whole node can be killed)."""
    env = {**os.environ, 'PYTHON': PY, 'OMP_NUM_THREADS': '1', 'NNODES': str(nnodes), 'NODE_RANK': str(node_rank),
           'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(port), 'RDZV_ID': f'test{port}'}
    args = ['bash', str(ROOT / 'tools/dist_train.sh'), str(cfg), '1', '--work-dir', str(work), *extra]
    if opts:
        args += ['--cfg-options', *opts]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _workers(agent_pid: int) -> list[int]:
    """The worker processes torchrun started (its children; each runs in a session of its own)."""
    kids = []
    for stat in Path('/proc').glob('[0-9]*/stat'):
        try:
            fields = stat.read_text().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == agent_pid:
            kids.append(int(stat.parent.name))
    return kids


def _kill_node(proc) -> None:
    """SIGKILL one node's launcher and its workers, as when the machine dies (torchrun's workers sit in their own
    sessions, so the launcher's process group alone would leave them running)."""
    pids = _workers(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            _kill_node(p)
            p.wait()


def _lr(path: Path) -> float:
    from mmplugin.checkpoint import load_checkpoint_file
    ckpt = load_checkpoint_file(path)
    return ckpt['optimizer']['param_groups'][0]['lr'], ckpt['meta']['iter']


def _ramp(it: int, scale: float) -> float:
    """LinearLR(start_factor=0.25, begin=0, end=WARMUP) after ``it`` steps, on the config lr scaled by ``scale``.
    mmengine's ``end`` is exclusive: the factor climbs linearly over ``end - begin - 1`` steps (LinearParamScheduler's
    ``total_iters``)."""
    return BASE_LR * scale * (0.25 + 0.75 * min(it, WARMUP - 1) / (WARMUP - 1))


@pytest.mark.parametrize('bad', [0, -5, 'soon', True, None])
def test_collective_timeout_is_validated(bad):
    """A distributed run always has a bounded collective timeout: the config's, else the plugin's default; a value
    that is not a positive number of seconds is refused before any process group starts."""
    from mmengine.config import Config

    from mmplugin.engine.ddp import DEFAULT_DIST_TIMEOUT_S, dist_timeout, setup_cpu_distributed
    assert dist_timeout(Config(dict())) == DEFAULT_DIST_TIMEOUT_S
    assert dist_timeout(Config(dict(env_cfg=dict(dist_cfg=dict(timeout=42))))) == 42.0
    cfg = Config(dict(launcher='pytorch', env_cfg=dict(dist_cfg=dict(timeout=bad))))
    with pytest.raises(ValueError, match='env_cfg.dist_cfg.timeout'):
        setup_cpu_distributed(cfg)
    untouched = Config(dict(launcher='none'))
    setup_cpu_distributed(untouched)
    assert 'env_cfg' not in untouched and 'model_wrapper_cfg' not in untouched


_SILENT_PEER = """
import os, sys, time
import torch, torch.distributed as dist
from mmengine.config import Config
from mmplugin.engine.ddp import setup_cpu_distributed
setup_cpu_distributed(Config(dict(launcher='pytorch', env_cfg=dict(dist_cfg=dict(timeout=float(sys.argv[1]))))))
if dist.get_rank() == 1:
    time.sleep(60)  # alive but silent: a hung process, a stopped node, a partition
    sys.exit(0)
start = time.time()
try:
    dist.all_reduce(torch.ones(1))
except Exception as err:
    print(f'raised after {time.time() - start:.1f} s: {type(err).__name__}', flush=True)
    os._exit(3)
print('all_reduce returned', flush=True)
"""


@pytest.mark.slow
def test_silent_rank_is_bounded_by_the_configured_timeout():
    """``env_cfg.dist_cfg.timeout`` reaches the gloo process group the plugin starts on CPU: a collective waiting for
    a rank that is alive but never answers raises after that many seconds (here 3), not torch's 30 minutes."""
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, 'OMP_NUM_THREADS': '1', 'RANK': str(rank), 'LOCAL_RANK': str(rank), 'WORLD_SIZE': '2',
               'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(port), 'PYTHONPATH': str(ROOT)}
        procs.append(subprocess.Popen([PY, '-c', _SILENT_PEER, '3'], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    try:
        out, _ = procs[0].communicate(timeout=120)
    finally:
        _stop(procs)
    m = re.search(r'raised after ([\d.]+) s', out)
    print(m.group(0) if m else out[-500:])
    assert procs[0].returncode == 3 and m, out[-3000:]
    assert 3.0 - 0.5 <= float(m.group(1)) < 3.0 + 10, out[-3000:]  # the timeout, plus scheduling slack on 2 cores


def _losses(text: str) -> list[float]:
    return [float(v) for v in re.findall(r'Iter\(train\).*?\sloss: ([\d.]+)', text)]


@pytest.fixture(scope='module')
def two_nodes(tmp_path_factory, tiny_cfg):
    """4 iterations on 2 nodes x 1 process on 127.0.0.1 (tools/dist_train.sh, c10d rendezvous): exit codes, logs,
    work dir."""
    root = tmp_path_factory.mktemp('two_nodes')
    work, port = root / 'work', _free_port()
    logs = [open(root / f'node{r}.log', 'w') for r in (0, 1)]
    procs = [_launch(tiny_cfg, work, 2, r, port, log=logs[r]) for r in (0, 1)]
    try:
        rcs = [p.wait(timeout=300) for p in procs]
    finally:
        _stop(procs)
    return rcs, [(root / f'node{r}.log').read_text() for r in (0, 1)], work


@pytest.mark.slow
def test_two_nodes_train_through_the_c10d_rendezvous(two_nodes):
    """Both nodes join one rendezvous, train as world size 2 (mmengine scales the lr for batch 2 x 2 = 4: factor 1)
    and exit 0; rank 0 writes the checkpoints."""
    rcs, text, work = two_nodes
    assert rcs == [0, 0], '\n'.join(t[-3000:] for t in text)
    both = with_env_dump(text[0] + text[1], work)
    assert 'GPU number: 2' in both and 'Distributed training: True' in both, both[-3000:]
    assert re.search(r'current batch size is 4\. Scaling the original LR by 1\.0', both), both[-3000:]
    lr, it = _lr(work / 'iter_4.pth')
    assert it == 4 and lr == pytest.approx(_ramp(4, 1.0), rel=1e-6)


def _wait_for(path: Path, procs, seconds: float) -> None:
    deadline = time.time() + seconds
    while not path.exists() and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_node_ends_the_job_then_resume_on_one_node(tmp_path, tiny_cfg):
    """SIGKILL of node 1 (launcher and worker, as when the machine dies) mid-training: node 0 exits non-zero within
    seconds (its next collective fails on the closed connection). ``--resume`` on 1 node x 1 process then continues
    the iteration counter from the newest checkpoint, with half the samples per iteration, and the lr schedule the
    checkpoint carries (docs/distributed.md: the resumed optimizer and scheduler state replace mmengine's
    ``auto_scale_lr`` for the new world size)."""
    from mmplugin.cli.runner import find_resumable_checkpoint
    work, port = tmp_path / 'work', _free_port()
    logs = [open(tmp_path / f'node{r}.log', 'w') for r in (0, 1)]
    opts = ['train_cfg.max_iters=1000', 'env_cfg.dist_cfg.timeout=60']
    procs = [_launch(tiny_cfg, work, 2, r, port, *opts, log=logs[r]) for r in (0, 1)]
    try:
        _wait_for(work / 'iter_4.pth', procs, 300)
        assert (work / 'iter_4.pth').exists(), (tmp_path / 'node0.log').read_text()[-3000:]
        _kill_node(procs[1])
        killed = time.time()
        rc0 = procs[0].wait(timeout=120)
        elapsed = time.time() - killed
    finally:
        _stop(procs)
    log0 = (tmp_path / 'node0.log').read_text()
    print(f'node 0 exited {rc0} {elapsed:.1f} s after node 1 was killed')
    assert rc0 != 0, log0[-3000:]
    # bound: gloo sees the peer's closed sockets at once; torchrun polls its worker every 0.1 s
    assert elapsed < 30, (elapsed, log0[-3000:])
    assert not (work / 'iter_1000.pth').exists()

    last = find_resumable_checkpoint(str(work))
    k = int(re.search(r'iter_(\d+)\.pth$', last).group(1))
    assert k >= 4
    with open(tmp_path / 'resume.log', 'w') as log:
        proc = _launch(tiny_cfg, work, 1, 0, _free_port(), f'train_cfg.max_iters={k + 2}', log=log,
                       extra=['--resume'])
        rc = proc.wait(timeout=300)
    text = (tmp_path / 'resume.log').read_text()
    assert rc == 0, text[-3000:]
    assert re.search(rf'resuming from \S*iter_{k}\.pth', text) and 'GPU number: 1' in with_env_dump(text), text[-3000:]
    # mmengine's linear scaling for the new world size, 1 x 2 = 2 samples per iteration: factor 0.5 ...
    assert re.search(r'current batch size is 2\. Scaling the original LR by 0\.5', text), text[-3000:]
    assert re.search(rf'Iter\(train\) \[\s*{k + 1}/{k + 2}\]', text), text[-3000:]  # the counter goes on
    lr, it = _lr(work / f'iter_{k + 2}.pth')
    assert it == k + 2
    # ... which the resumed optimizer / scheduler state overrides: the lr is the 2-node schedule's, factor 1
    assert lr == pytest.approx(_ramp(k + 2, 1.0), rel=1e-6) and lr != pytest.approx(_ramp(k + 2, 0.5), rel=1e-3)


def _flexible(tmp_path, tiny_cfg, strategy: str, name: str) -> list[float]:
    """2 iterations of the tiny config through FlexibleRunner with ``strategy``, 1 node x 2 processes: the losses."""
    cfg = tmp_path / f'{name}.py'
    cfg.write_text(f"""
_base_ = [{str(tiny_cfg)!r}]
runner_type = 'FlexibleRunner'
strategy = {strategy}
train_cfg = dict(max_iters=2)
default_hooks = dict(checkpoint=dict(interval=10 ** 6, save_last=False))
""")
    env = {**os.environ, 'PYTHON': PY, 'OMP_NUM_THREADS': '1', 'MASTER_PORT': str(_free_port()), 'RDZV_ID': name}
    out = subprocess.run(['bash', str(ROOT / 'tools/dist_train.sh'), str(cfg), '2', '--work-dir', str(tmp_path / name)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    # rank 0's log file: its environment dump and each logged iteration once (several ranks share the console pipe)
    run_log = with_env_dump('', tmp_path / name)
    assert 'GPU number: 2' in run_log, log[-3000:]
    return _losses(run_log), run_log


@pytest.mark.slow
def test_fsdp_through_the_flexible_runner_matches_ddp(tmp_path, tiny_cfg):
    """The tiny config with ``runner_type='FlexibleRunner'``: mmengine's FSDPStrategy (the plugin's CPU FSDP wrapper,
    one FSDP unit per SwiftFormer encoder) logs the losses of its DDPStrategy over the first two iterations (same
    seed, data and initial weights; FSDP's reduce-scatter and DDP's all-reduce average the same gradients).
    Checkpoints are off here (saving and resuming: test_fsdp_run_saves_is_killed_and_resumes_with_the_same_losses)."""
    fsdp, log = _flexible(tmp_path, tiny_cfg, "dict(type='FSDPStrategy', model_wrapper=dict("
                          "auto_wrap_policy=dict(type='mmplugin.block_wrap_policy')))", 'fsdp')
    # the strategy's wrapper, swapped
    assert "type='mmplugin.CPUFullyShardedDataParallel'" in log, log[-3000:]
    ddp, log = _flexible(tmp_path, tiny_cfg, "dict(type='DDPStrategy')", 'ddp')
    assert "type='mmplugin.CPUDistributedDataParallel'" in log, log[-3000:]
    # the log prints 4 decimals: equal values differ by at most one unit of the last digit after rounding
    assert len(fsdp) == 2 and fsdp == pytest.approx(ddp, abs=1.5e-4), (fsdp, ddp)


_FSDP = ("dict(type='FSDPStrategy', model_wrapper=dict(auto_wrap_policy=dict(type='mmplugin.block_wrap_policy')))")


def _fsdp_cfg(tmp_path, tiny_cfg, max_iters: int) -> Path:
    """The tiny config under FSDP, without random layers (dropout, drop path) or augmentations (flips), so that a
    resumed run replays the same computation: the data order comes back with the iteration counter, the RNG states
    do not (onedl-mmengine even resumes the sampler without loading, so without replaying, the skipped batches)."""
    cfg = tmp_path / f'fsdp_{max_iters}.py'
    cfg.write_text(f"""
_base_ = [{str(tiny_cfg)!r}]
runner_type = 'FlexibleRunner'
strategy = {_FSDP}
model = dict(backbone=dict(drop_path_rate=0.0), decode_head=dict(dropout_ratio=0.0))
train_dataloader = dict(dataset=dict(pipeline=[dict(type='LoadImageFromFile'),
                                               dict(type='LoadAnnotations', reduce_zero_label=False),
                                               dict(type='PackSegInputs')]))
train_cfg = dict(max_iters={max_iters})
""")
    return cfg


def _torchrun(cfg, work, log, *extra):
    env = {**os.environ, 'PYTHON': PY, 'OMP_NUM_THREADS': '1', 'MASTER_PORT': str(_free_port()),
           'RDZV_ID': f'fsdp{_free_port()}'}
    return subprocess.Popen(['bash', str(ROOT / 'tools/dist_train.sh'), str(cfg), '2', '--work-dir', str(work),
                             *extra], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_fsdp_run_saves_is_killed_and_resumes_with_the_same_losses(tmp_path, tiny_cfg):
    """FSDP on CPU, 2 processes: a run saves sharded checkpoints (one ``rank<i>.pth`` per rank in ``iter_N.pth/``,
    parameters and AdamW moments as ShardedTensors, read back weights-only), is SIGKILLed after its iteration-2
    checkpoint, and ``--resume`` continues from it with the losses of an uninterrupted run of the same config."""
    with open(tmp_path / 'whole.log', 'w') as log:
        whole = _torchrun(_fsdp_cfg(tmp_path, tiny_cfg, 4), tmp_path / 'whole', log)
        assert whole.wait(timeout=300) == 0, (tmp_path / 'whole.log').read_text()[-3000:]
    reference = _losses((tmp_path / 'whole.log').read_text())
    assert len(reference) == 4
    work = tmp_path / 'killed'
    with open(tmp_path / 'killed.log', 'w') as log:
        proc = _torchrun(_fsdp_cfg(tmp_path, tiny_cfg, 1000), work, log)
        try:
            _wait_for(work / 'iter_4.pth' / 'rank1.pth', [proc], 300)  # iter_2 is complete once iter_4 starts saving
        finally:
            _stop([proc])
    killed = (tmp_path / 'killed.log').read_text()
    assert (work / 'iter_2.pth' / 'rank0.pth').is_file() and (work / 'iter_2.pth' / 'rank1.pth').is_file(), \
        killed[-3000:]
    assert 'Traceback' not in killed, killed[-3000:]
    with open(tmp_path / 'resumed.log', 'w') as log:
        resumed = _torchrun(_fsdp_cfg(tmp_path, tiny_cfg, 4), work, log, '--resume', str(work / 'iter_2.pth'))
        assert resumed.wait(timeout=300) == 0, (tmp_path / 'resumed.log').read_text()[-3000:]
    text = (tmp_path / 'resumed.log').read_text()
    assert 'resumed epoch: 0, iter: 2' in text, text[-3000:]
    assert _losses(text) == reference[2:], (_losses(text), reference)


def test_sharded_checkpoint_folders_are_resumable_only_when_complete(tmp_path):
    """``iter_N.pth/`` folders (sharded FSDP checkpoints) count for ``--resume`` when every ``rank<i>.pth`` from 0
    is a complete archive; a folder with a missing or truncated rank file is passed over, naming why."""
    import torch

    from mmplugin.checkpoint import CheckpointError
    from mmplugin.cli.runner import _check_resume_path, find_resumable_checkpoint
    for n, ranks in ((2, (0, 1)), (4, (0, 1)), (6, (0, 2))):
        folder = tmp_path / f'iter_{n}.pth'
        folder.mkdir()
        for r in ranks:
            torch.save({'w': torch.ones(2)}, folder / f'rank{r}.pth')
    (tmp_path / 'iter_4.pth' / 'rank1.pth').write_bytes((tmp_path / 'iter_4.pth' / 'rank1.pth').read_bytes()[:50])
    skipped = []
    assert find_resumable_checkpoint(str(tmp_path), skipped) == str(tmp_path / 'iter_2.pth')
    assert 'iter_6.pth (a folder without rank0.pth .. rankN.pth (found ranks [0, 2]))' in skipped[0]
    assert skipped[1].startswith('iter_4.pth (rank1.pth:')
    _check_resume_path(str(tmp_path / 'iter_2.pth'))
    with pytest.raises(CheckpointError, match='not a complete sharded checkpoint'):
        _check_resume_path(str(tmp_path / 'iter_4.pth'))
