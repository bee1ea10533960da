"""The megatron backend's checkpoint restores training exactly (weights, megatron's distributed optimizer state
sharded over DP, the LR warm-up), and its Hugging Face export (gathered from TP/PP shards, and from the model chunks
of the interleaved schedule) loads in transformers with the trained weights."""

import math
import os

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rl.backends.logits import token_logprobs
from rl.core.packing import PackedBatch
from tests.rl.backends.megatron.harness import COLLECTIVE_TIMEOUT_S, run_state_round_trips
from tests.testing import tolerances

VOCAB = 61


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from rl.tasks.embedded.tokenizer import build_tokenizer

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=64)
    path = str(tmp_path_factory.mktemp("qwen2"))
    Qwen2ForCausalLM(config).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


LAYOUTS = {
    "pp2": {"pipeline_model_parallel_size": 2},
    # two model chunks per rank, stored as a PP=4 checkpoint (the HF conversion below reads it as one)
    "pp2-vp2": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
    "tp2": {"tensor_model_parallel_size": 2},
    "dp2": {},  # the distributed optimizer's state is sharded over the two DP ranks
    "tp2-optimizer-offload": {"tensor_model_parallel_size": 2, "optimizer_cpu_offload": True},
}


@pytest.fixture(scope="module")
def results(model_path, tmp_path_factory):
    runs = run_state_round_trips(model_path, VOCAB, list(LAYOUTS.values()), str(tmp_path_factory.mktemp("runs")))
    return dict(zip(LAYOUTS, runs, strict=True))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_restores_training_and_export_loads_in_transformers(model_path, results, layout):
    result = results[layout]
    assert result["got"] == result["expected"]
    # the schedule's second rate, resumed too
    assert result["expected"]["lr"] == pytest.approx(5.5e-3, rel=0, abs=tolerances.lr_schedule_gap(1e-2))
    # trainer.collective_timeout_s reaches the world group, megatron-core's groups (whole minutes) and later ones
    assert result["timeouts"] == {"world": COLLECTIVE_TIMEOUT_S, "a new group": COLLECTIVE_TIMEOUT_S,
                                  "megatron data-parallel": math.ceil(COLLECTIVE_TIMEOUT_S / 60) * 60}
    assert result["got_state"].keys() == result["expected_state"].keys()
    for name, tensor in result["expected_state"].items():
        assert torch.equal(result["got_state"][name], tensor), name

    batch: PackedBatch = result["batch"]
    loaded = AutoModelForCausalLM.from_pretrained(result["export"]).eval()
    original = AutoModelForCausalLM.from_pretrained(model_path).eval()
    mask = batch.loss_mask
    with torch.no_grad():
        logits = _per_sequence_logits(loaded, batch)
        exported = PackedBatch.align_to_targets(token_logprobs(logits, batch.prediction_targets()))
        before = PackedBatch.align_to_targets(token_logprobs(_per_sequence_logits(original, batch),
                                                             batch.prediction_targets()))
    # trained_logprobs: the first backend after its second step, whose weights the restored backend reproduced
    # megatron's packed forward and transformers' per-sequence one: the same sums in other orders
    gap = tolerances.logprob_gap(loaded.config, logits, int(batch.seq_lengths.max()))
    tolerances.assert_within(exported[mask], result["trained_logprobs"][mask], gap, "exported logprobs")
    assert (before[mask] - exported[mask]).abs().max() > gap, "the export must hold trained weights"
    # the training checkpoint converts to HF too: transformers on the converted weights gives the logprobs megatron
    # gave with the weights it saved (after the first step; the second step moved them, so this is no other step's)
    from rl.backends.megatron.hf_io import megatron_checkpoint_to_hf

    converted = os.path.join(os.path.dirname(result["export"]), "ckpt_hf")
    megatron_checkpoint_to_hf(os.path.join(os.path.dirname(result["export"]), "ckpt"), converted)
    with torch.no_grad():
        restored_model = AutoModelForCausalLM.from_pretrained(converted).eval()
        logits = _per_sequence_logits(restored_model, batch)
        restored = PackedBatch.align_to_targets(token_logprobs(logits, batch.prediction_targets()))
    gap = tolerances.logprob_gap(restored_model.config, logits, int(batch.seq_lengths.max()))
    tolerances.assert_within(restored[mask], result["saved_logprobs"][mask], gap, "restored logprobs")
    assert (restored[mask] - exported[mask]).abs().max() > gap, "the checkpoint holds the first step's"


def _per_sequence_logits(model, batch: PackedBatch) -> torch.Tensor:
    """Each sequence alone through transformers (no packing involved in the oracle)."""
    return torch.cat([model(input_ids=batch.select([i]).input_ids[None]).logits[0]
                      for i in range(batch.num_sequences)])


def test_distributed_optimizer_shards_its_state_over_data_parallel_ranks(results):
    """DP=2: rank 0's optimizer holds about half of the weights (ZeRO-1); TP=2 has no DP, so all of its shard."""
    dp2, tp2 = results["dp2"], results["tp2"]
    assert dp2["optimizer_numel"] < dp2["weights_numel"] / 2 + 64  # + megatron's padding of the buffer to DP
    assert tp2["optimizer_numel"] == tp2["weights_numel"]


def test_expert_parallel_checkpoint_restores_training(tmp_path_factory):
    """EP=2: a chain of two distributed optimizers (dense over DP=2, experts over expert-DP=1)."""
    from rl.tasks.embedded.tokenizer import build_tokenizer

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                           num_experts_per_tok=2, tie_word_embeddings=False, max_position_embeddings=64)
    path = str(tmp_path_factory.mktemp("mixtral"))
    MixtralForCausalLM(config).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    result, = run_state_round_trips(path, VOCAB, [{"expert_model_parallel_size": 2}],
                                    str(tmp_path_factory.mktemp("moe_runs")))
    assert result["got"] == result["expected"]
    for name, tensor in result["expected_state"].items():
        assert torch.equal(result["got_state"][name], tensor), name


def test_optimizer_cpu_offload_trains_like_the_device_optimizer(results, model_path):
    """Host masters and moments (optimizer_cpu_offload) take the same two steps as the plain AdamW."""
    offloaded, plain = results["tp2-optimizer-offload"], results["tp2"]
    # Two AdamW steps at lr <= 1e-2 (the decay only lowers it): the two optimizers' update arithmetic and weight
    # writes round differently, and the second step's gradients then differ by the rounding of this model's
    # forward and backward over the batch (`tolerances.adam_bulk_gap`).
    batch: PackedBatch = plain["batch"]
    config = AutoConfig.from_pretrained(model_path)
    grad_rtol = tolerances.network_rtol(tolerances.decoder_reductions(
        config, int(batch.seq_lengths.max()), batch.num_tokens), torch.float32)
    for name, tensor in plain["expected_state"].items():
        bound = tolerances.adam_bulk_gap(tensor, 1e-2, 2, grad_rtol, torch.float32)
        tolerances.assert_within(offloaded["expected_state"][name], tensor, bound, name)
    # The logprobs after those steps: megatron's forward on each run's weights against transformers' on each run's
    # export (the same sums in other orders, once per run), plus what the two runs' weight gaps move transformers'
    # logprobs by (one code path on both exports, so nothing but the weights differs there).
    exported = []
    for run in (offloaded, plain):
        with torch.no_grad():
            logits = _per_sequence_logits(AutoModelForCausalLM.from_pretrained(run["export"]).eval(), batch)
        exported.append((PackedBatch.align_to_targets(token_logprobs(logits, batch.prediction_targets())), logits))
    reorder = sum(tolerances.logprob_gap(config, logits, int(batch.seq_lengths.max())) for _, logits in exported)
    bound = reorder + (exported[0][0] - exported[1][0]).abs()
    tolerances.assert_within(offloaded["trained_logprobs"], plain["trained_logprobs"], bound, "trained logprobs")
