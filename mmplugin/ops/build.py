"""Compiling and loading the plugin's C kernels (``mmplugin/ops/*.c``): built once per source and compiler with the
system C compiler, cached under ``$MMPLUGIN_KERNEL_CACHE`` (default ``$XDG_CACHE_HOME/mmplugin/kernels`` or
``~/.cache/mmplugin/kernels``) and loaded with :mod:`ctypes`.

Why plain C through ctypes rather than a PyTorch C++ extension: the kernels take raw pointers and sizes, so they need
no PyTorch headers, and a build takes about a second instead of a minute; a ctypes call releases the GIL, so the
callers can split the work over threads. The same C compiler that mmcv's ops need is all that is required; where
there is none, :func:`load_kernels` raises :class:`KernelUnavailable` and the callers use PyTorch's or mmcv's kernels
instead (warned once).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

__all__ = ['ISA_FLAGS', 'KernelUnavailable', 'cpu_isa', 'kernel_cache_dir', 'load_kernels', 'kernel_library']

_SOURCES = Path(__file__).parent
_FLAGS = ['-O3', '-shared', '-fPIC', '-std=c99']
# per kernel: roi_align without fused multiply-adds, so the sample coordinates are computed as the reference computes
# them; window_attention with them (its error bound allows either, and they halve the inner loops' instructions) and
# with OpenMP: linked by soname, it shares the runtime a torch build linked as libgomp.so.1 has loaded, so the kernel
# runs on torch's intra-op threads instead of competing with them while they spin-wait for the next operator (where
# torch bundles a renamed copy, the kernel gets a pool of its own, sized by torch.get_num_threads() all the same); gelu
# and layer_norm as window_attention; transpose (a bit copy) with OpenMP only
_KERNEL_FLAGS = {'roi_align': ['-ffp-contract=off'], 'window_attention': ['-ffp-contract=fast', '-fopenmp'],
                 'gelu': ['-ffp-contract=fast', '-fopenmp'], 'layer_norm': ['-ffp-contract=fast', '-fopenmp'],
                 'transpose': ['-fopenmp']}
# vector code for the kernel family torch dispatches to (torch.backends.cpu.get_cpu_capability(), which
# ATEN_CPU_CAPABILITY lowers), so a library never uses instructions the process was told to avoid
# (AVX512_BF16: AVX-512 plus the bf16 dot-product instructions, where the CPU has them: window attention's bf16 path
# multiplies bf16 operands two per lane)
_AVX512 = ['-mavx512f', '-mavx512bw', '-mavx512vl', '-mavx512dq', '-mfma', '-DMMP_VW=16']
ISA_FLAGS = {'AVX512_BF16': [*_AVX512, '-mavx512bf16'], 'AVX512': _AVX512, 'AVX2': ['-mavx2', '-mfma', '-DMMP_VW=8'],
             'DEFAULT': ['-DMMP_VW=4']}


class KernelUnavailable(RuntimeError):
    """The C kernel could not be built or loaded (no compiler, or the build failed); the message says why."""


def kernel_cache_dir() -> Path:
    """Where built kernels are kept (created on first use)."""
    env = os.environ.get('MMPLUGIN_KERNEL_CACHE')
    if env:
        return Path(env)
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'mmplugin' / 'kernels'


def _compiler() -> list[str]:
    """The compiler command: ``$CC`` split as a shell would (``CC="ccache gcc"`` works), default ``cc``."""
    cc = shlex.split(os.environ.get('CC', 'cc')) or ['cc']
    path = shutil.which(cc[0])
    if path is None:
        raise KernelUnavailable(f'no C compiler ({cc[0]!r} is not on PATH; set CC)')
    return [path, *cc[1:]]


ISA_ENV = 'MMPLUGIN_KERNEL_ISA'


def cpu_isa() -> str:
    """The vector ISA a kernel is built for: ``'AVX512_BF16'`` (AVX-512 with the bf16 dot products, where the
    process may use bf16 instructions: ``ONEDNN_MAX_CPU_ISA`` below ``AVX512_CORE_BF16`` rules them out),
    ``'AVX512'``, ``'AVX2'`` (x86-64, as torch dispatches: ``ATEN_CPU_CAPABILITY`` lowers it) or ``'DEFAULT'``.
    ``$MMPLUGIN_KERNEL_ISA`` (a key of :data:`ISA_FLAGS`) lowers it further, never raises it: e.g. ``AVX512`` keeps
    the window attention's bf16 path in fp32 arithmetic."""
    import torch
    cap = torch.backends.cpu.get_cpu_capability() if platform.machine() in ('x86_64', 'AMD64') else 'DEFAULT'
    return _isa_for(cap, os.environ.get(ISA_ENV, '').upper(), os.environ.get('ONEDNN_MAX_CPU_ISA', ''))


@functools.lru_cache(maxsize=None)
def _isa_for(cap: str, asked: str, onednn_cap: str) -> str:
    """:func:`cpu_isa` for torch's capability ``cap`` and the two variables' values (cached: it reads
    ``/proc/cpuinfo``, and every kernel call asks)."""
    import torch

    from mmplugin.utils.cpu import native_bf16
    isa = cap if cap in ISA_FLAGS else 'DEFAULT'
    if isa == 'AVX512' and torch.cpu._is_avx512_bf16_supported() and native_bf16():
        isa = 'AVX512_BF16'
    order = list(ISA_FLAGS)  # newest first
    if asked:
        if asked not in ISA_FLAGS:
            raise ValueError(f'{ISA_ENV} must be one of {tuple(ISA_FLAGS)}, got {asked!r}')
        isa = order[max(order.index(isa), order.index(asked))]
    return isa


@functools.lru_cache(maxsize=None)
def load_kernels(name: str, isa: str | None = None) -> ctypes.CDLL:
    """The shared library built from ``mmplugin/ops/{name}.c`` (and the headers beside it); with ``isa`` (a key of
    :data:`ISA_FLAGS`), built with that ISA's vector flags.

    The cache key covers the sources, the flags, the compiler's version and the machine architecture, so an edited
    source or another compiler builds anew; the build is written to a temporary file and renamed, so concurrent
    processes (one per GPU or distributed rank) never load a half-written library. A cached library that does not
    load is rebuilt once.
    """
    cc = _compiler()
    source = _SOURCES / f'{name}.c'
    if not source.is_file():
        raise KernelUnavailable(f'no kernel source {source}')
    try:
        version = subprocess.run([*cc, '--version'], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f'C compiler {cc[0]} does not run: {e}') from e
    if isa is not None and isa not in ISA_FLAGS:
        raise ValueError(f'isa must be one of {tuple(ISA_FLAGS)}, got {isa!r}')
    flags = [*_FLAGS, *_KERNEL_FLAGS.get(name, []), *(ISA_FLAGS[isa] if isa else [])]
    digest = hashlib.sha256()
    sources = [p.read_text() for p in sorted(_SOURCES.glob('*.[ch]'))]
    for part in [version, platform.machine(), ' '.join(flags), *sources]:
        digest.update(part.encode())
    target = kernel_cache_dir() / f'{name}{"-" + isa.lower() if isa else ""}-{digest.hexdigest()[:16]}.so'
    if not target.is_file():
        _build(cc, flags, source, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError:
        _build(cc, flags, source, target)  # a damaged cached file
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f'cannot load {target}: {e}') from e


_libraries: dict[tuple[str, str], ctypes.CDLL | None] = {}


def kernel_library(name: str, signatures: dict[str, list], fallback: str) -> ctypes.CDLL | None:
    """The library ``name`` built for the ISA torch dispatches to (:func:`cpu_isa`), its functions typed from
    ``signatures`` (function name -> ctypes argument types; each returns an ``int`` status), or None where it cannot
    be built: warned once per ISA as ``"{fallback}: {reason}"`` and not retried. Where the compiler cannot build
    the AVX512_BF16 variant (``-mavx512bf16`` needs GCC 10 / Clang 9), the AVX512 build serves, with a warning."""
    key = (name, cpu_isa())
    if key not in _libraries:
        lib = None
        try:
            lib = load_kernels(name, key[1])
        except KernelUnavailable as e:
            if key[1] == 'AVX512_BF16':
                try:
                    lib = load_kernels(name, 'AVX512')
                    warnings.warn(f'{name}: no bf16 dot-product build ({e}); the AVX512 build runs', stacklevel=4)
                except KernelUnavailable as e2:
                    e = e2
            if lib is None:
                warnings.warn(f'{fallback}: {e}', stacklevel=4)
        for fn_name, args in signatures.items() if lib is not None else ():
            fn = getattr(lib, fn_name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        _libraries[key] = lib
    return _libraries[key]


def _build(cc: list[str], flags: list[str], source: Path, target: Path) -> None:
    """Compile ``source`` into ``target`` through a temporary file in the same directory and an atomic rename; the
    library is readable by every user (``mkstemp`` creates files for the owner only). Any failure (compiler error,
    timeout, an unwritable cache directory) is a :class:`KernelUnavailable`, so callers fall back."""
    try:
        _compile(cc, flags, source, target)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f'building {source.name} into {target.parent} failed: {e}') from e


def _compile(cc: list[str], flags: list[str], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.so.tmp', dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([*cc, *flags, '-o', tmp, str(source), '-lm'], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise KernelUnavailable(f'building {source.name} with {cc[0]} failed:\n{proc.stderr.strip()}')
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
