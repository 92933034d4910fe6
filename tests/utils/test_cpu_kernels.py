"""The kernel-family helper the test runner uses: what it reports follows the environment caps, and the caps it
hands out really make PyTorch take the older paths (checked in a fresh interpreter, where the caps act)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mmplugin.utils import cpu

CPU_PY = cpu.__file__  # runs standalone: no package import, so a fresh interpreter starts in a second


def _in_fresh_process(env: dict[str, str], code: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ('ONEDNN_MAX_CPU_ISA', 'ATEN_CPU_CAPABILITY')}
    out = subprocess.run([sys.executable, '-c', code], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_families_follow_the_cpu_flags(monkeypatch):
    monkeypatch.delenv('ONEDNN_MAX_CPU_ISA', raising=False)
    for flags, family, n_lower in [({'avx2', 'fma'}, 'AVX2', 0), ({'sse4_2'}, None, 0),
                                   ({'avx2', 'fma', 'avx512f', 'avx512bw', 'avx512vl'}, 'AVX512', 1),
                                   ({'avx2', 'fma', 'avx512f', 'avx512bw', 'avx512vl', 'avx512_bf16'}, 'AVX512-BF16',
                                    1),
                                   ({'avx2', 'fma', 'avx512_bf16', 'amx_bf16', 'amx_tile'}, 'AMX', 1)]:
        monkeypatch.setattr(cpu, 'cpu_flags', lambda flags=flags: flags)
        assert cpu.kernel_family() == family if family else 'no AVX2' in cpu.kernel_family()
        envs = cpu.lower_isa_envs()
        assert len(envs) == n_lower, (flags, envs)
        if envs:  # the next-lower family
            want = 'AVX512_CORE_BF16' if family == 'AMX' else 'AVX2'
            assert envs[0]['ONEDNN_MAX_CPU_ISA'] == want, (family, envs)
        monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX2')
        if family:
            assert cpu.kernel_family() == ('AVX2' if family == 'AVX2' else f'AVX2 (capped from {family})')
        monkeypatch.delenv('ONEDNN_MAX_CPU_ISA')


def test_the_avx2_cap_takes_effect():
    if not cpu.lower_isa_envs():
        pytest.skip(f'this CPU has no kernel family newer than AVX2 ({cpu.describe()})')
    avx2 = {'ONEDNN_MAX_CPU_ISA': 'AVX2', 'ATEN_CPU_CAPABILITY': 'avx2'}
    code = 'import torch; print(torch.backends.cpu.get_cpu_capability())'
    assert _in_fresh_process(avx2, code) == 'AVX2'
    assert _in_fresh_process({}, code) != 'AVX2'
    assert 'capped' in _in_fresh_process(avx2, f'import runpy; runpy.run_path({CPU_PY!r}, run_name="__main__")')


def test_command_line_prints_one_line_per_family():
    out = _in_fresh_process({}, f'import sys, runpy; sys.argv = ["cpu", "--lower-envs"]; '
                                f'runpy.run_path({CPU_PY!r}, run_name="__main__")')
    lines = [ln for ln in out.splitlines() if ln]
    assert len(lines) == len(cpu.lower_isa_envs())
    assert all('ONEDNN_MAX_CPU_ISA=' in ln for ln in lines)


@pytest.mark.parametrize('cap, amx, bf16', [('', True, True), ('ALL', True, True), ('AVX512_CORE_AMX', True, True),
                                            ('avx512_core_amx_fp16', True, True), ('AVX512_CORE_FP16', False, True),
                                            ('AVX512_CORE_BF16', False, True), ('AVX512_CORE_VNNI', False, False),
                                            ('AVX512_CORE', False, False), ('AVX2_VNNI', False, False),
                                            ('SSE41', False, False), ('NOT_AN_ISA', False, False)])
def test_every_onednn_cap_name_rules_amx_and_bf16_in_or_out(cap, amx, bf16, monkeypatch):
    """On an AMX machine, each of oneDNN's ISA names caps the process at the family it allows (upper or lower case);
    a name below AVX2 or unknown caps at the oldest family, so no cap turns newer instructions on."""
    monkeypatch.setattr(cpu, 'cpu_flags', lambda: {'avx2', 'fma', 'avx512f', 'avx512bw', 'avx512vl', 'avx512_bf16',
                                                   'amx_bf16', 'amx_tile'})
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', cap)
    assert cpu.native_amx() == amx and cpu.native_bf16() == bf16
    assert cpu.kernel_family().startswith('AMX' if amx else 'AVX512-BF16' if bf16 else 'AVX')
