"""Which CPU kernel family this process runs, and how to make it run the older one.

PyTorch (ATen's vectorised kernels) and oneDNN (convolutions, matmuls, bf16) pick their kernels by instruction
set at run time, so the same code rounds differently, and treats non-finite values differently, on AVX2,
AVX-512, AVX512-BF16 and AMX machines. ``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY`` cap both at an older
instruction set (never raise them), which lets one machine exercise two kernel families. The test runner uses
:func:`lower_isa_envs` to run the numeric tests again on the older families.

``python -m mmplugin.utils.cpu`` (or the file itself: it imports only torch) prints what this process runs;
``--lower-envs`` prints, one line per older family, the ``NAME=value`` pairs that select it (nothing on a machine
that has only AVX2 or less).
"""
from __future__ import annotations

import argparse
import os
import platform

import torch

__all__ = ['cpu_flags', 'cpu_model', 'cpu_vendor', 'kernel_family', 'native_bf16', 'native_amx', 'lower_isa_envs',
           'describe']

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


def cpu_vendor() -> str:
    """``vendor_id`` of CPU 0 (``'GenuineIntel'``, ``'AuthenticAMD'``, ...), ``''`` where ``/proc/cpuinfo`` has none."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('vendor_id'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return ''


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
    name = info.get('model name', 'unknown CPU')
    return f'{name} (family {info.get("cpu family", "?")}, model {info.get("model", "?")})'


def _hardware_family(flags: set[str]) -> int | None:
    for i, (_, need, _) in enumerate(_FAMILIES):
        if all(f in flags for f in need):
            return i
    return None


# oneDNN's ISA names (``ONEDNN_MAX_CPU_ISA``) -> the newest family of ``_FAMILIES`` they allow; an ISA below AVX2
# (SSE41, AVX) or a name not listed caps at the oldest family, so an unknown cap never turns newer instructions on
_CAP_FAMILY = {'ALL': 0, 'DEFAULT': 0, 'AVX512_CORE_AMX': 0, 'AVX512_CORE_AMX_FP16': 0, 'AVX10_1_512_AMX': 0,
               'AVX10_1_512_AMX_FP16': 0, 'AVX10_2_512_AMX_2': 0,
               'AVX512_CORE_BF16': 1, 'AVX512_CORE_FP16': 1, 'AVX10_1_512': 1, 'AVX10_2_512': 1,
               'AVX512_CORE': 2, 'AVX512_CORE_VNNI': 2,
               'AVX2': 3, 'AVX2_VNNI': 3, 'AVX2_VNNI_2': 3}


def _families_in_use() -> tuple[int, int] | None:
    """(hardware family, family after the environment's cap) as indices into ``_FAMILIES``."""
    hw = _hardware_family(cpu_flags())
    if hw is None:
        return None
    onednn = os.environ.get('ONEDNN_MAX_CPU_ISA', '').strip().upper()
    if not onednn:
        return hw, hw
    return hw, max(hw, _CAP_FAMILY.get(onednn, len(_FAMILIES) - 1))


def kernel_family() -> str:
    """The newest family this process may use: the hardware's, capped by ``ONEDNN_MAX_CPU_ISA`` as set in the
    environment (e.g. ``'AVX2 (capped from AMX)'``)."""
    fam = _families_in_use()
    if fam is None:
        return f'{platform.machine()} (no AVX2)'
    hw, used = fam
    name = _FAMILIES[used][0]
    return name if used == hw else f'{name} (capped from {_FAMILIES[hw][0]})'


def native_bf16() -> bool:
    """This process may use the CPU's bf16 instructions: AMX or AVX512-BF16 hardware, not capped below it by
    ``ONEDNN_MAX_CPU_ISA``."""
    fam = _families_in_use()
    return fam is not None and fam[1] <= 1


def native_amx() -> bool:
    """This process may use AMX tiles: AMX hardware, not capped below it by ``ONEDNN_MAX_CPU_ISA``."""
    fam = _families_in_use()
    return fam is not None and fam[1] == 0


def lower_isa_envs() -> list[dict[str, str]]:
    """The environment that runs the next-lower kernel family on this machine; ``[]`` on an AVX2 machine.

    AMX -> AVX512-BF16 (native bf16 without AMX tiles: the kernels of AVX-512 CPUs with bf16, whose channels-last
    bf16 convolution is the one that leaks non-finite values); AVX512-BF16 and AVX-512 -> AVX2 (the oldest family
    PyTorch's x86 build vectorises for, shared by most deployment CPUs). A list, so that a runner can loop.
    """
    hw = _hardware_family(cpu_flags())
    avx2 = len(_FAMILIES) - 1
    if hw is None or hw >= avx2:
        return []
    return [dict(_FAMILIES[1][2])] if hw == 0 else [dict(_FAMILIES[avx2][2])]


def describe() -> str:
    """One line: CPU model, kernel family in use, ATen's capability and whether bf16 runs natively."""
    return (f'{cpu_model()}; kernels: {kernel_family()}; ATen {torch.backends.cpu.get_cpu_capability()}; '
            f'native bf16: {"yes" if native_bf16() else "no"}')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--lower-envs', action='store_true',
                        help='print one line of NAME=value pairs per older kernel family (nothing on AVX2)')
    parser.add_argument('--family', action='store_true', help='print only the kernel family in use')
    args = parser.parse_args(argv)
    if args.family:
        print(kernel_family())
    elif args.lower_envs:
        for env in lower_isa_envs():
            print(' '.join(f'{k}={v}' for k, v in env.items()))
    else:
        print(describe())


if __name__ == '__main__':
    main()
