"""What bounds CPU inference speed beyond the kernels: freed-memory retention (``mmplugin.inference.allocator``:
after :func:`retain_freed_memory` a large block freed and allocated again is not page-faulted in again; ``--fast``
applies it on CPUs; run in a fresh process, since the setting is process-wide and the fault counts must not depend
on what the test process did before) and the GEMM-only floor (``mmplugin.analysis.gemm_floor``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmplugin.inference import allocator

CHILD = r'''
import json, warnings
import torch
from mmplugin.inference import allocator

def cycle():  # a 64 MiB activation, written, then freed
    torch.empty(16 * 2**20).fill_(1.0)

before = allocator.minor_faults_per_call(cycle)

class Model(torch.nn.Module):
    def extract_feat(self, x):
        return x

with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # bf16 may be emulated on this CPU: only the side effect matters here
    from mmplugin.inference import enable_fast_inference
    enable_fast_inference(Model(), 'bf16', 'cpu')
after = min(allocator.minor_faults_per_call(cycle) for _ in range(3))  # steady state: an aligned request
# may once miss the freed block by its alignment padding and take new pages from the top of the heap
print(json.dumps(dict(before=before, after=after, retained=allocator.retained())))
'''


def test_retained_memory_is_not_faulted_in_again():
    if allocator._glibc() is None:
        pytest.skip('not glibc: retain_freed_memory is a no-op here')
    out = subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res['retained'], res  # enable_fast_inference on a CPU applied it
    if res['before'] == 0:
        pytest.skip(f'this C library already reuses freed blocks ({res}); nothing to compare')
    # 64 MiB in 4 KiB pages is 16,384 faults (32 with 2 MiB transparent huge pages); once retained the block comes
    # from the kept heap: no new pages (a few faults of unrelated small allocations are allowed)
    assert res['after'] <= max(8, res['before'] // 100), res


def test_idempotent_and_reported():
    first = allocator.retain_freed_memory()
    assert allocator.retain_freed_memory() == first == allocator.retained()


def test_gemm_floor_records_every_linear_shape():
    """``linear_shapes`` sees each linear with its flattened row count and each dense 1x1 convolution with its pixel
    count (checked against the shapes written out by hand for a (2, 5, 8) and a (2, 3, 4, 6) input; 3x3,
    depthwise and strided convolutions are not GEMMs), and the floor's totals are the sums over those shapes."""
    import torch
    from torch import nn

    from mmplugin.analysis.gemm_floor import gemm_floor, linear_shapes
    model = nn.Sequential(nn.Linear(8, 12), nn.GELU(), nn.Linear(12, 8), nn.Linear(8, 12))
    x = torch.randn(2, 5, 8)
    assert linear_shapes(model, x) == {(10, 8, 12): 2, (10, 12, 8): 1}
    res = gemm_floor(model, x, torch.float32, repeats=1)
    assert res['gflop'] * 1e9 == 2 * (10 * 8 * 12 * 2 + 10 * 12 * 8) == res['model_gflop'] * 1e9  # all GEMM
    convs = nn.Sequential(nn.Conv2d(3, 16, 1), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Conv2d(16, 8, 1),
                          nn.Conv2d(8, 8, 1, stride=2), nn.Conv2d(8, 8, 3, padding=1))
    assert linear_shapes(convs, torch.randn(2, 3, 4, 6)) == {(48, 3, 16): 1, (48, 16, 8): 1}
    res = gemm_floor(convs, torch.randn(2, 3, 4, 6), torch.float32, repeats=1)
    assert res['gflop'] * 1e9 == 2 * 48 * (3 * 16 + 16 * 8) < res['model_gflop'] * 1e9
    assert res['seconds'] == pytest.approx(sum(calls * sec for *_, calls, sec, _ in res['shapes']))
    assert {kern for *_, kern in res['shapes']} <= {'mkl', 'onednn', 'onednn prepacked'} and res['peak_gflops'] > 0


def test_gemm_floor_counts_the_faster_kernel_of_each_shape():
    """The floor is the sum over shapes of calls x the fastest kernel's time (given timings), and every kernel
    computes the same product."""
    import collections

    import torch

    from mmplugin.analysis.gemm_floor import gemm_call, gemm_seconds
    shapes = collections.Counter({(10, 8, 12): 2, (4, 4, 4): 3})
    times = {('gemm', (10, 8, 12), 'mkl'): 1.0, ('gemm', (10, 8, 12), 'onednn'): 0.5,
             ('gemm', (10, 8, 12), 'onednn prepacked'): 0.6, ('gemm', (4, 4, 4), 'mkl'): 0.1,
             ('gemm', (4, 4, 4), 'onednn'): 0.3, ('gemm', (4, 4, 4), 'onednn prepacked'): 0.2}
    total, best = gemm_seconds(times, shapes)
    assert total == pytest.approx(2 * 0.5 + 3 * 0.1)
    assert best == {(10, 8, 12): (0.5, 'onednn'), (4, 4, 4): (0.1, 'mkl')}
    torch.manual_seed(0)
    a = gemm_call(33, 17, 9, torch.float32, 'mkl')()
    for kern in ('onednn', 'onednn prepacked'):
        torch.manual_seed(0)
        b = gemm_call(33, 17, 9, torch.float32, kern)()
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_training_shapes_are_the_products_autograd_runs():
    """``training_shapes`` of a forward's linears and 1x1 convolutions equals, as a multiset of ``(rows, reduction,
    columns)``, the matrix products that a forward + backward actually dispatches (``mm`` / ``addmm`` / 1x1
    convolutions and their backward recorded at the aten level, with operand shapes), and its FLOPs equal torch's
    own FLOP counter for the step."""
    import collections

    import torch
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from mmplugin.analysis.gemm_floor import linear_shapes, training_shapes

    class Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.mm.default:
                (m, k), (_, n) = args[0].shape, args[1].shape
                self.shapes[(m, k, n)] += 1
            elif func is torch.ops.aten.addmm.default:
                (m, k), (_, n) = args[1].shape, args[2].shape
                self.shapes[(m, k, n)] += 1
            return out

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.GELU(), nn.Linear(12, 5))
    x = torch.randn(2, 7, 8, requires_grad=True)  # the input's gradient too, as inside a network
    want = training_shapes(linear_shapes(model, x.detach()))
    assert want == {(14, 8, 12): 1, (14, 12, 8): 1, (12, 14, 8): 1, (14, 12, 5): 1, (14, 5, 12): 1, (5, 14, 12): 1}
    rec = Products()
    with rec:
        model(x).sum().backward()
    assert rec.shapes == want
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    assert counter.get_total_flops() == sum(2 * m * k * n * c for (m, k, n), c in want.items())


@pytest.mark.heavy
def test_gemm_floor_command_line_errors():
    """--help works and a malformed backbone or size is a usage error (exit 2) naming what is expected."""
    cmd = [sys.executable, '-m', 'mmplugin.analysis.gemm_floor']
    out = subprocess.run(cmd + ['--help'], capture_output=True, text=True)
    assert out.returncode == 0 and 'FAMILY:ARCH' in out.stdout, out.stderr[-500:]
    for args, msg in ((['swin'], 'FAMILY one of'), (['nope:tiny'], 'FAMILY one of'),
                      (['swin:tiny', '80x'], 'not a size'), (['swin:tiny', '64', 'fp16'], 'invalid choice')):
        out = subprocess.run(cmd + args, capture_output=True, text=True)
        assert out.returncode == 2 and msg in out.stderr, (args, out.stderr[-500:])


def test_peak_memory_children_run_under_the_parents_threads_and_a_fixed_mmap_threshold():
    """The peak-memory rows run in fresh processes: they get this process's torch thread count, and glibc's mmap
    threshold fixed at 128 KiB with no retain settings, whether or not this process retains freed memory (so RSS
    follows the live allocations). A child started through the helper maps a freed 1 MiB block out again: its RSS
    drops back, where the retain settings would have kept it."""
    import subprocess
    import sys

    import torch

    from mmplugin.analysis.memory import MMAP_THRESHOLD, child_env
    from mmplugin.inference import allocator
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        env = child_env()
        out = subprocess.run([sys.executable, '-c', 'import torch; print(torch.get_num_threads())'], env=env,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == '1'
    finally:
        torch.set_num_threads(threads)
    saved = allocator._RETAINED
    try:  # as after --retain-memory (without changing this process's allocator)
        allocator._RETAINED = True
        env = child_env()
    finally:
        allocator._RETAINED = saved
    assert env['MALLOC_MMAP_THRESHOLD_'] == str(MMAP_THRESHOLD) == '131072'
    assert 'MALLOC_MMAP_MAX_' not in env and 'MALLOC_TRIM_THRESHOLD_' not in env
    import platform
    if sys.platform.startswith('linux') and platform.libc_ver()[0] == 'glibc':
        grown, left = _freed_blocks_kept(env)
        assert grown >= 60 * 1024 and left < 4 * 1024, (grown, left)  # KiB: 64 MiB touched, then given back
        grown, left = _freed_blocks_kept({k: v for k, v in env.items() if k != 'MALLOC_MMAP_THRESHOLD_'})
        assert left > 32 * 1024, (grown, left)  # glibc's adaptive threshold: the same blocks stay in the heap


_PROBE = """
import ctypes, re
rss = lambda: int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
def blocks():
    big, small = [], []
    for _ in range(64):
        big.append(libc.malloc(1 << 20))
        ctypes.memset(big[-1], 1, 1 << 20)
        small.append(libc.malloc(1024))  # a live block after each large one: a heap cannot be trimmed below it
    return big, small
for p in blocks()[0]:  # glibc's adaptive threshold rises past 1 MiB here
    libc.free(ctypes.c_void_p(p))
before = rss()
big, small = blocks()
peak = rss()
for p in big:
    libc.free(ctypes.c_void_p(p))
print(peak - before, rss() - before)
"""


def _freed_blocks_kept(env) -> tuple[int, int]:
    """A child under ``env`` allocates and touches 64 blocks of 1 MiB (each followed by a small block it keeps),
    frees the large ones: its RSS growth at the peak and after the frees, in KiB."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, '-c', _PROBE], env=env, capture_output=True, text=True, check=True)
    grown, left = map(int, out.stdout.split())
    return grown, left
