"""The launch sizes chosen from a device's figures (rl/kernels/sizing.py), each worked out by hand for devices this
machine does not have, and the chunked loss taking the size its device gets."""

from __future__ import annotations

import pytest
import torch

from rl.kernels.autograd import add_product
from rl.kernels.reference.chunked import WORKSPACE_ROW_BYTES, token_chunk
from rl.kernels.sizing import (
    CPU,
    KERNELS,
    Device,
    candidate_launches,
    default_launch,
    device_of,
    loss_chunk_tokens,
    pack_block,
    row_block,
)
from tests.testing.tolerances import assert_within, matmul_gap

GIB = 1 << 30
H100 = Device("cuda", sm_count=132, memory_bytes=80 * GIB)
QWEN2_VOCAB = 151_936


def test_a_cpu_chunk_holds_16_mi_logits():
    assert device_of(torch.device("cpu")) == CPU
    assert loss_chunk_tokens(16_384, QWEN2_VOCAB, 8 * QWEN2_VOCAB, CPU) == (1 << 24) // QWEN2_VOCAB == 110
    assert loss_chunk_tokens(100, QWEN2_VOCAB, 8 * QWEN2_VOCAB, CPU) == 100  # fewer tokens: one chunk of all
    assert loss_chunk_tokens(10, 1 << 25, 8, CPU) == 1  # a vocabulary past 16 Mi: one token at a time
    assert loss_chunk_tokens(1, QWEN2_VOCAB, 8, CPU) == loss_chunk_tokens(0, QWEN2_VOCAB, 8, CPU) == 1


def test_a_gpu_chunk_is_whole_waves_within_a_64th_of_memory():
    """The kernel path's chunk holds bf16 logits and their gradient: 2 * 2 * 151,936 = 607,744 bytes a token. An
    H100's 64th is 1,342,177,280 bytes: 2,208 tokens fit, 16 whole waves of 132 rows: 2,112."""
    row_bytes = 2 * 2 * QWEN2_VOCAB
    assert H100.memory_bytes // 64 // row_bytes == 2208
    chunk = loss_chunk_tokens(16_384, QWEN2_VOCAB, row_bytes, H100)
    assert chunk == 2112 and type(chunk) is int
    assert loss_chunk_tokens(2208, QWEN2_VOCAB, row_bytes, H100) == 2208  # every token fits: one chunk
    assert loss_chunk_tokens(2209, QWEN2_VOCAB, row_bytes, H100) == 2112


def test_a_small_gpu_still_takes_a_whole_wave():
    """80 SMs and fp32 buffers of 152k columns (1,215,488 bytes a token). With 8 GiB, 110 tokens fit in the 64th:
    rounded down to one wave of 80. With 1 GiB, 13 fit, less than a wave: a wave of 80 all the same."""
    small = Device("cuda", sm_count=80, memory_bytes=8 * GIB)
    row_bytes = 8 * QWEN2_VOCAB
    assert loss_chunk_tokens(4096, QWEN2_VOCAB, row_bytes, small) == 80
    tiny = Device("cuda", sm_count=80, memory_bytes=GIB)
    assert loss_chunk_tokens(4096, QWEN2_VOCAB, row_bytes, tiny) == 80
    assert loss_chunk_tokens(50, QWEN2_VOCAB, row_bytes, tiny) == 50  # never more than the tokens


@pytest.mark.parametrize(("vocab", "block", "warps"), [
    (QWEN2_VOCAB, 4096, 8), (4096, 4096, 8), (2048, 2048, 8), (2047, 2048, 8), (1024, 1024, 4), (1000, 1024, 4),
    (1, 1, 4),
])
def test_row_kernels_walk_the_vocabulary_in_power_of_two_blocks(vocab, block, warps):
    assert row_block(vocab) == (block, warps)


@pytest.mark.parametrize(("features", "block_d"), [(1, 1), (3, 4), (64, 64), (896, 64)])
def test_packing_copies_64_positions_and_up_to_64_features_a_step(features, block_d):
    assert pack_block(features) == (64, block_d)


def test_the_chunked_loss_takes_its_devices_size_unless_told():
    hidden, weight = torch.zeros(300, 4), torch.zeros(1 << 20, 4)
    assert token_chunk(hidden, weight, None, WORKSPACE_ROW_BYTES * weight.shape[0]) == 16
    assert token_chunk(hidden, weight, 7, WORKSPACE_ROW_BYTES * weight.shape[0]) == 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_product_accumulates_in_fp32(dtype):
    """total += a @ b with fp32 `total`: bf16 factors are exact in fp32, so the result is the fp32 product of their
    values added to `total`, K = 96 terms rounded in float32 (`matmul_gap`) plus the final addition's rounding."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(24, 96, generator=g).to(dtype), torch.randn(96, 40, generator=g).to(dtype)
    start = torch.randn(24, 40, generator=g)
    total = start.clone()
    assert add_product(total, a, b) is total and total.dtype == torch.float32
    want = start.double() + a.double() @ b.double()
    bound = matmul_gap(a, b) + want.abs() * 2.0**-24
    assert_within(total, want, bound, f"{dtype} factors")


def test_the_candidate_launches_span_blocks_and_warps_and_hold_the_default():
    """Qwen2's vocabulary: the five row blocks x 4, 8, 16 warps. A vocabulary of 1000 rounds up to one block of
    1024. Hidden states of 4096: 4 position blocks x 5 feature blocks x 4, 8 warps; a scalar per position: blocks
    of 1 feature only."""
    row = candidate_launches("logprobs_fwd", QWEN2_VOCAB)
    assert sorted({c["BLOCK_V"] for c in row}) == [1024, 2048, 4096, 8192, 16384] and len(row) == 15
    assert candidate_launches("fused_loss", 1000) == [{"BLOCK_V": 1024, "num_warps": w} for w in (4, 8, 16)]
    pack = candidate_launches("pack", 4096)
    assert len(pack) == 40 and {c["BLOCK_D"] for c in pack} == {16, 32, 64, 128, 256}
    assert {c["BLOCK_T"] for c in pack} == {16, 32, 64, 128} and {c["num_warps"] for c in pack} == {4, 8}
    assert {c["BLOCK_D"] for c in candidate_launches("unpack", 1)} == {1}
    assert {c["BLOCK_D"] for c in candidate_launches("unpack", 20)} == {16, 32}
    for kernel in KERNELS:
        for size in (1, 3, 20, 37, 896, 1000, 4096, 32768, QWEN2_VOCAB):
            assert default_launch(kernel, size) in candidate_launches(kernel, size), (kernel, size)
    assert default_launch("unpack", 896) == {"BLOCK_T": 64, "BLOCK_D": 64, "num_warps": 4}
    assert default_launch("logprobs_bwd", QWEN2_VOCAB) == {"BLOCK_V": 4096, "num_warps": 8}
    with pytest.raises(ValueError, match=r"named 'softmax'; the kernels with launch sizes are logprobs_fwd, "
                                         r"logprobs_bwd, fused_loss, pack, unpack$"):
        candidate_launches("softmax", 10)
