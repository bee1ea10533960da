"""Triton kernels of the packing ops (see rl/kernels/reference/packing.py for the layout)."""

import triton
import triton.language as tl


@triton.jit
def cu_seqlens_kernel(lengths_ptr, cu_ptr, num_seqs, BLOCK: tl.constexpr):
    """cu[0] = 0, cu[i + 1] = lengths[0] + ... + lengths[i]; one program, a running carry across blocks."""
    tl.store(cu_ptr, 0)
    carry = 0
    for start in range(0, num_seqs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        lengths = tl.load(lengths_ptr + offs, mask=offs < num_seqs, other=0)
        sums = tl.cumsum(lengths, axis=0) + carry
        tl.store(cu_ptr + offs + 1, sums, mask=offs < num_seqs)
        carry += tl.sum(lengths, axis=0)


@triton.jit
def position_ids_kernel(cu_ptr, out_ptr, BLOCK: tl.constexpr):
    """Program (b, j) writes positions j*BLOCK.. of sequence b."""
    b = tl.program_id(0)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    start = tl.load(cu_ptr + b)
    length = tl.load(cu_ptr + b + 1) - start
    tl.store(out_ptr + start + t, t.to(tl.int64), mask=t < length)


@triton.jit
def pack_kernel(padded_ptr, out_ptr, cu_ptr, width, feat, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[cu[b] + t, :] = padded[b, t, :] for t < length b; program (b, j) covers BLOCK_T positions."""
    b = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    start = tl.load(cu_ptr + b).to(tl.int64)
    length = tl.load(cu_ptr + b + 1).to(tl.int64) - start
    rows = t < length
    src = (b.to(tl.int64) * width + t)[:, None] * feat
    dst = (start + t)[:, None] * feat
    for d0 in range(0, feat, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)[None, :]
        ok = rows[:, None] & (d < feat)
        tl.store(out_ptr + dst + d, tl.load(padded_ptr + src + d, mask=ok), mask=ok)


@triton.jit
def unpack_kernel(packed_ptr, out_ptr, cu_ptr, width, feat, pad_value, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[b, t, :] = packed[cu[b] + t, :] for t < length b, else pad_value; program (b, j) covers BLOCK_T slots."""
    b = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    start = tl.load(cu_ptr + b).to(tl.int64)
    length = tl.load(cu_ptr + b + 1).to(tl.int64) - start
    src = (start + t)[:, None] * feat
    dst = (b.to(tl.int64) * width + t)[:, None] * feat
    for d0 in range(0, feat, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)[None, :]
        inside = (t < width)[:, None] & (d < feat)
        real = (t < length)[:, None] & (d < feat)
        values = tl.load(packed_ptr + src + d, mask=real, other=pad_value)
        tl.store(out_ptr + dst + d, values, mask=inside)
