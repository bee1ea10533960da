"""Launch sizes chosen from the device: how many tokens the chunked hidden-state loss takes at a time, and the block
shapes of the Triton kernels. Each choice is a pure function of the device's figures (`Device`), so a test on a CPU
checks what an H100 or an A10 would get; `device_of` reads the figures of a tensor's device."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Device:
    """What the sizes depend on: the kind ("cuda" or "cpu"), the streaming multiprocessors and the memory, and the
    name that measured launches are recorded under (rl/kernels/launches.py)."""

    kind: str
    sm_count: int = 0
    memory_bytes: int = 0
    name: str = ""


CPU = Device("cpu", name="cpu")


def device_of(device: torch.device) -> Device:
    if device.type != "cuda":
        return CPU
    props = torch.cuda.get_device_properties(device)
    return Device("cuda", props.multi_processor_count, props.total_memory, props.name)


CPU_CHUNK_ELEMENTS = 1 << 24
"""Logit elements per chunk on a CPU (64 MiB of fp32): a chunk's passes over its logits stay near the caches."""

GPU_MEMORY_SHARE = 64
"""A chunk's [chunk, V] buffers take at most 1/64 of the device's memory (1.2 GiB of an 80 GB H100)."""


def loss_chunk_tokens(num_tokens: int, vocab: int, row_bytes: int, device: Device) -> int:
    """Tokens per chunk of the chunked hidden-state loss, whose chunk holds `row_bytes` per token.

    On a GPU, chunks are as large as 1/64 of the memory allows: every chunk reads the whole [V, H] LM head for its
    logits and reads and writes the whole fp32 [V, H] weight-gradient accumulator, and the chunk is the inner
    dimension of that gradient's matmul, so small chunks make it memory-bound (at 128 tokens it moves 8 bytes for
    every 64 flops). All the tokens when they fit; otherwise whole waves of rows (a multiple of the SM count: the
    loss kernel runs one program per row), at least one wave. On a CPU, 16 Mi logit elements per chunk."""
    tokens = max(int(num_tokens), 1)
    if device.kind != "cuda":
        return max(1, min(tokens, CPU_CHUNK_ELEMENTS // int(vocab)))
    fits = device.memory_bytes // GPU_MEMORY_SHARE // int(row_bytes)
    if tokens <= fits:
        return tokens
    wave = device.sm_count
    return min(tokens, max(wave, fits // wave * wave))


MAX_BLOCK_V = 4096
"""Vocabulary columns a row kernel reads per step (16 per thread at 8 warps)."""


def row_block(vocab: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the row kernels (token logprobs forward and backward, the fused loss): one program per
    row walks the vocabulary in blocks of BLOCK_V, the vocabulary rounded up to a power of two (Triton's ranges
    are) up to 4096; 8 warps from 2048 columns up, else 4 (Triton's row-softmax ladder)."""
    block = min(MAX_BLOCK_V, next_power_of_2(vocab))
    return block, 8 if block >= 2048 else 4


PACK_ROWS, MAX_BLOCK_D = 64, 64
"""Positions a packing program copies (BLOCK_T), and the most features it copies per step (BLOCK_D)."""


def pack_block(features: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D) of pack and unpack: a program copies 64 positions, BLOCK_D features at a time, the
    features rounded up to a power of two up to 64 (a scalar per position: 1)."""
    return PACK_ROWS, min(MAX_BLOCK_D, next_power_of_2(features))


ROW_KERNELS = ("logprobs_fwd", "logprobs_bwd", "fused_loss")
"""The kernels that walk a row of logits (their size: the vocabulary)."""
PACK_KERNELS = ("pack", "unpack")
"""The kernels that move rows of features between padded and packed layouts (their size: the features)."""
KERNELS = ROW_KERNELS + PACK_KERNELS


def default_launch(kernel: str, size: int) -> dict[str, int]:
    """The launch `kernel` gets at `size` where no measured one is recorded for the device: `row_block` or
    `pack_block` (pack and unpack at Triton's default 4 warps)."""
    check_kernel(kernel)
    if kernel in ROW_KERNELS:
        block, warps = row_block(size)
        return {"BLOCK_V": block, "num_warps": warps}
    rows, block = pack_block(size)
    return {"BLOCK_T": rows, "BLOCK_D": block, "num_warps": 4}


ROW_BLOCKS, ROW_WARPS = (1024, 2048, 4096, 8192, 16384), (4, 8, 16)
PACK_ROW_BLOCKS, PACK_FEATURE_BLOCKS, PACK_WARPS = (16, 32, 64, 128), (16, 32, 64, 128, 256), (4, 8)


def candidate_launches(kernel: str, size: int) -> list[dict[str, int]]:
    """The launches bench/tune_kernels.py times for `kernel` at `size`, and the only ones a record may hold (the
    tests run each block shape against the torch reference). Blocks wider than the size rounded up to a power of
    two are left out: they would only mask more lanes. The default launch is always among them."""
    check_kernel(kernel)
    widest = next_power_of_2(size)
    if kernel in ROW_KERNELS:
        blocks = sorted({min(block, widest) for block in (*ROW_BLOCKS, row_block(size)[0])})
        return [{"BLOCK_V": b, "num_warps": w} for b in blocks for w in ROW_WARPS]
    features = sorted({min(block, widest) for block in (*PACK_FEATURE_BLOCKS, pack_block(size)[1])})
    return [{"BLOCK_T": t, "BLOCK_D": d, "num_warps": w} for t in PACK_ROW_BLOCKS for d in features
            for w in PACK_WARPS]


def check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"no kernel named {kernel!r}; the kernels with launch sizes are {', '.join(KERNELS)}")


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
