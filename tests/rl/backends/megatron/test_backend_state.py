"""The megatron backend's checkpoint restores training exactly, and its Hugging Face export (gathered from TP/PP
shards) loads in transformers with the trained weights."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rl.backends.logits import token_logprobs
from rl.core.packing import PackedBatch
from tests.rl.backends.megatron.harness import run_state_round_trips

VOCAB = 61


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from rl.core.embedded.tokenizer import build_tokenizer

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=64)
    path = str(tmp_path_factory.mktemp("qwen2"))
    Qwen2ForCausalLM(config).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


LAYOUTS = {
    "pp2": {"pipeline_model_parallel_size": 2},
    "tp2": {"tensor_model_parallel_size": 2},
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
    assert result["got_state"].keys() == result["expected_state"].keys()
    for name, tensor in result["expected_state"].items():
        assert torch.equal(result["got_state"][name], tensor), name

    batch: PackedBatch = result["batch"]
    loaded = AutoModelForCausalLM.from_pretrained(result["export"]).eval()
    original = AutoModelForCausalLM.from_pretrained(model_path).eval()
    mask = batch.loss_mask
    with torch.no_grad():
        exported = PackedBatch.align_to_targets(token_logprobs(_per_sequence_logits(loaded, batch),
                                                               batch.prediction_targets()))
        before = PackedBatch.align_to_targets(token_logprobs(_per_sequence_logits(original, batch),
                                                             batch.prediction_targets()))
    # trained_logprobs: the first backend after its second step, whose weights the restored backend reproduced
    torch.testing.assert_close(exported[mask], result["trained_logprobs"][mask], rtol=0, atol=1e-5)
    # the training checkpoint converts to HF too (weights after the first step)
    from rl.backends.megatron.hf_io import megatron_checkpoint_to_hf

    converted = os.path.join(os.path.dirname(result["export"]), "ckpt_hf")
    megatron_checkpoint_to_hf(os.path.join(os.path.dirname(result["export"]), "ckpt"), converted)
    assert AutoModelForCausalLM.from_pretrained(converted).config.vocab_size == VOCAB
    assert not torch.allclose(before[mask], exported[mask], atol=1e-4), "the export must hold trained weights"


def _per_sequence_logits(model, batch: PackedBatch) -> torch.Tensor:
    """Each sequence alone through transformers (no packing involved in the oracle)."""
    return torch.cat([model(input_ids=batch.select([i]).input_ids[None]).logits[0]
                      for i in range(batch.num_sequences)])


def test_optimizer_cpu_offload_trains_like_the_device_optimizer(results):
    """Host masters and moments (optimizer_cpu_offload) take the same two steps as the plain AdamW."""
    offloaded, plain = results["tp2-optimizer-offload"], results["tp2"]
    torch.testing.assert_close(offloaded["trained_logprobs"], plain["trained_logprobs"], rtol=0, atol=1e-6)
    for name, tensor in plain["expected_state"].items():
        torch.testing.assert_close(offloaded["expected_state"][name], tensor, rtol=0, atol=1e-6, msg=name)
