"""Which CPU kernel family this process runs, and how to make it run the older one.

PyTorch (ATen's vectorised kernels) and oneDNN (convolutions, matmuls, bf16) pick their kernels by instruction
set at run time, so the same code rounds differently, and treats non-finite values differently, on AVX2,
AVX-512, AVX512-BF16 and AMX machines. ``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY`` cap both at an older
instruction set (never raise them), which lets one machine exercise two kernel families. The test runner uses
:func:`lower_isa_env` to run the numeric tests a second time on the older family.

``python -m mmplugin.utils.cpu`` prints what this process runs; ``--lower-env`` prints the ``NAME=value`` pairs
that select the next-lower family, or nothing on a machine that has only AVX2 (or less).
"""
from __future__ import annotations

import argparse
import os
import platform

import torch

__all__ = ['cpu_flags', 'cpu_model', 'kernel_family', 'lower_isa_env', 'describe']

# Families from newest to oldest: (name, cpuinfo flags that make it, the env that caps a process at it).
_FAMILIES = (
    ('AMX', ('amx_bf16', 'amx_tile'), {}),
    ('AVX512-BF16', ('avx512_bf16', ), {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE_BF16'}),
    ('AVX512', ('avx512f', 'avx512bw', 'avx512vl'), {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE',
                                                      'ATEN_CPU_CAPABILITY': 'avx512'}),
    ('AVX2', ('avx2', 'fma'), {'ONEDNN_MAX_CPU_ISA': 'AVX2', 'ATEN_CPU_CAPABILITY': 'avx2'}),
)


def cpu_flags() -> set[str]:
    """The instruction-set flags the kernel reports for CPU 0 (empty where ``/proc/cpuinfo`` does not exist)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    """``model name`` with family / model numbers, e.g. ``'AMD EPYC 9R14 (family 25, model 17)'``."""
    info = {}
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if ':' in line:
                    k, v = (s.strip() for s in line.split(':', 1))
                    info.setdefault(k, v)
                if not line.strip() and info:
                    break
    except OSError:
        return platform.processor() or 'unknown CPU'
    return f'{info.get("model name", "unknown CPU")} (family {info.get("cpu family", "?")}, model {info.get("model", "?")})'


def _hardware_family(flags: set[str]) -> int | None:
    for i, (_, need, _) in enumerate(_FAMILIES):
        if all(f in flags for f in need):
            return i
    return None


def kernel_family() -> str:
    """The newest family this process may use: the hardware's, capped by ``ONEDNN_MAX_CPU_ISA`` /
    ``ATEN_CPU_CAPABILITY`` as set in the environment (e.g. ``'AVX2 (capped from AMX)'``)."""
    hw = _hardware_family(cpu_flags())
    if hw is None:
        return f'{platform.machine()} (no AVX2)'
    onednn = os.environ.get('ONEDNN_MAX_CPU_ISA', '').upper()
    capped = hw
    for i, (_, _, env) in enumerate(_FAMILIES):
        if i >= hw and onednn and env.get('ONEDNN_MAX_CPU_ISA') == onednn:
            capped = i
            break
    name = _FAMILIES[capped][0]
    return name if capped == hw else f'{name} (capped from {_FAMILIES[hw][0]})'


def lower_isa_env() -> dict[str, str]:
    """Environment that runs the AVX2 kernel family on a machine with a newer one; ``{}`` on an AVX2 machine.

    AVX2 is the oldest family PyTorch's x86 build vectorises for and the one most deployment CPUs share, so it is
    the second family worth covering whatever the newest one is.
    """
    hw = _hardware_family(cpu_flags())
    avx2 = len(_FAMILIES) - 1
    if hw is None or hw >= avx2:
        return {}
    return dict(_FAMILIES[avx2][2])


def describe() -> str:
    """One line: CPU model, kernel family in use, ATen's capability and whether oneDNN runs bf16 natively."""
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        bf16 = False
    return (f'{cpu_model()}; kernels: {kernel_family()}; ATen {torch.backends.cpu.get_cpu_capability()}; '
            f'oneDNN native bf16: {"yes" if bf16 and "capped" not in kernel_family() else "no"}')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--lower-env', action='store_true',
                        help='print NAME=value pairs selecting the AVX2 family (nothing on an AVX2 machine)')
    args = parser.parse_args(argv)
    if args.lower_env:
        print(' '.join(f'{k}={v}' for k, v in lower_isa_env().items()))
    else:
        print(describe())


if __name__ == '__main__':
    main()
