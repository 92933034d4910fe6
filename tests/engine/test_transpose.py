"""The batched transpose kernel (``mmplugin.ops.transpose``, ``transpose.c``): bit for bit ATen's transposed copy on
every vector ISA build, for 4- and 2-byte elements, sizes that fill no tile, several images and thread counts,
NaN payloads and signed zeros kept; where it declines (the caller then copies with ATen) and what it refuses."""
from __future__ import annotations

import ctypes

import pytest
import torch
from conftest import isa_kernel, require_compiler

from mmplugin.ops import transpose

_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]


def _source(batch, rows, cols, dtype):
    g = torch.Generator().manual_seed(rows * 7 + cols)
    x = torch.randn(batch, rows, cols, generator=g).to(dtype)
    bits = x.view(torch.int32 if dtype.itemsize == 4 else torch.int16)
    bits.view(-1)[::7] = torch.arange(bits.numel())[::7].to(bits.dtype)  # payload-carrying patterns, not only values
    x.view(-1)[1], x.view(-1)[-1] = float('nan'), -0.0
    return x


@pytest.mark.parametrize('isa', ['AVX512_BF16', 'AVX512', 'AVX2', 'DEFAULT'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize('shape', [(1, 60, 96), (3, 97, 33), (2, 1, 70), (1, 31, 1), (2, 64, 32), (2, 130, 67),
                                   (2, 37, 45)])
@pytest.mark.parametrize('threads', [1, 3])
def test_bits_equal_atens_copy(isa, dtype, shape, threads):
    """Every ISA build: the destination holds the source's bits transposed, whatever the tile remainders."""
    suffix = 'b32' if dtype.itemsize == 4 else 'b16'
    fn = isa_kernel('transpose', isa, f'mmplugin_transpose_{suffix}', _ARGS)
    x = _source(*shape, dtype)
    out = torch.full((shape[0], shape[2], shape[1]), 7.0, dtype=dtype)
    assert fn(x.data_ptr(), out.data_ptr(), *shape, threads) == 0
    ints = torch.int32 if dtype.itemsize == 4 else torch.int16
    assert torch.equal(out.view(ints), x.transpose(1, 2).contiguous().view(ints))


def test_wrapper_copies_or_declines():
    """transpose_into copies where it serves and otherwise returns False with the destination untouched; a size that
    does not match both tensors is an error."""
    require_compiler()
    assert transpose.available()
    x = _source(2, 40, 24, torch.bfloat16)
    out = torch.empty(2, 24, 40, dtype=torch.bfloat16)
    assert transpose.transpose_into(x, out, 2, 40, 24)
    assert torch.equal(out.view(torch.int16), x.transpose(1, 2).contiguous().view(torch.int16))
    for src, dst in ((x.double(), out.double()), (x, out.float()), (x.transpose(1, 2), out), (x, out[:, :, :20])):
        before = dst.clone()
        assert not transpose.transpose_into(src, dst, 2, 40, 24)
        torch.testing.assert_close(dst, before, rtol=0, atol=0, equal_nan=True)
    with torch.device('meta'):
        assert not transpose.transpose_into(torch.empty(2, 40, 24), torch.empty(2, 24, 40), 2, 40, 24)
    with pytest.raises(ValueError, match='2 x 40 x 25'):
        transpose.transpose_into(x, out, 2, 40, 25)
