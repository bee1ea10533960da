"""Where the on-policy shortcut skips the old-logprob pass, the update's own forward measures the trainer-vs-engine
gap that pass would have (`LossSettings.measure_rollout_gap`): a backend hands the batch's rollout logprobs to the
loss. Oracle: rollout logprobs planted at known distances from the backend's own logprobs, so the metric is the
mean of those distances, within the gap between the backend's two forwards of the same batch."""

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2ForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.registry import build_backend
from rl.core.algorithms import LossSettings
from rl.core.algorithms.loss import ROLLOUT_GAP
from rl.core.packing import pack_sequences
from tests.testing import tolerances
from tests.testing.backend_steps import write_small_qwen

VOCAB = 32  # write_small_qwen's


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    init_distributed(0, 1, "127.0.0.1", 0)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_small_qwen(str(tmp_path_factory.mktemp("model")))


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_the_update_measures_the_gap_to_the_rollout_logprobs(model_path, strategy):
    g = torch.Generator().manual_seed(0)
    sequences = []
    for n, prompt in ((7, 3), (11, 2), (5, 4)):
        mask = torch.arange(n) >= prompt
        sequences.append({"input_ids": torch.randint(1, VOCAB, (n,), generator=g), "loss_mask": mask,
                          "advantages": torch.randn(n, generator=g) * mask})
    batch = pack_sequences(sequences)
    backend = build_backend(strategy, ModelSpec(path=model_path, role="policy", temperature=0.8),
                            init_distributed(0, 1, "127.0.0.1", 0))
    own, _ = backend.logprobs(batch)
    mask = batch.loss_mask.bool()
    distance = (0.5 * torch.randn(own.shape, generator=g)).abs() * mask
    rollout = own + torch.where(torch.rand(own.shape, generator=g) < 0.5, distance, -distance)
    settings = LossSettings(measure_rollout_gap=True)
    normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(), num_sequences=batch.num_sequences)
    metrics = backend.forward_backward(batch.replace(rollout_logprobs=rollout), settings, normalizer)
    want = float(distance[mask].double().mean())
    # the training forward's logprobs against the no-grad forward's (`logprob_gap`, bounded by the logprobs'
    # magnitude), then the mean's float32 sum over the loss tokens
    model = Qwen2ForCausalLM.from_pretrained(model_path)
    with torch.no_grad():
        logits = torch.cat([model(seq["input_ids"][None]).logits[0] for seq in sequences])
    forwards = tolerances.logprob_gap(model.config, logits / 0.8, int(batch.seq_lengths.max()))
    tokens = int(mask.sum())
    rounding = tolerances.reordered_sum_gap(tokens, float((own - rollout).abs()[mask].sum()), torch.float32) / tokens
    assert abs(metrics[ROLLOUT_GAP] - want) <= forwards + rounding + want * 2.0**-23, (metrics[ROLLOUT_GAP], want)
    assert ROLLOUT_GAP not in backend.forward_backward(batch, settings, normalizer)  # no rollout logprobs: no gap
