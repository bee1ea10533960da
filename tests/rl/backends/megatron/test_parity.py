"""Parity suite: one training step of the megatron backend under TP=2, PP=2, SP, full recompute, DP=2 and EP=2
(2 gloo processes), with one or several micro-batches per schedule, and TP=2 x PP=2 (4 processes), gives the loss,
logprobs, entropy, gradients and grad norm of TP=PP=EP=1 (one process), of the fsdp2 backend (2 processes), and
per-token logprobs of transformers run on each sequence alone."""

import pytest
import torch
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

from rl.backends.logits import token_logprobs
from tests.rl.backends.megatron.harness import (
    VOCAB,
    assert_same_step,
    logprob_gap,
    qwen_model,
    run_step,
    run_steps,
    save_model,
    sequences,
)
from tests.testing import tolerances


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory):
    return qwen_model(tmp_path_factory.mktemp("qwen2"), hidden=64, layers=2)


@pytest.fixture(scope="module")
def mixtral_path(tmp_path_factory):
    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                           num_experts_per_tok=2, tie_word_embeddings=False, max_position_embeddings=64,
                           pad_token_id=0)
    return save_model(MixtralForCausalLM(config), tmp_path_factory.mktemp("mixtral"))


def hf_logprobs(path: str) -> torch.Tensor:
    """Each sequence alone through transformers: the oracle for per-token logprobs."""
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for seq in sequences(VOCAB):
            ids = seq["input_ids"]
            lp = token_logprobs(model(input_ids=ids[None]).logits[0, :-1], ids[1:])
            out.append(torch.cat([lp.new_zeros(1), lp]))
    return torch.cat(out)


@pytest.fixture(scope="module")
def qwen_reference(qwen_path):
    return run_step("megatron", qwen_path, VOCAB, world=1)


def test_single_rank_matches_transformers_and_fsdp2(qwen_path, qwen_reference):
    mask = torch.cat([s["loss_mask"] for s in sequences(VOCAB)])
    tolerances.assert_within(qwen_reference["logprobs"][mask], hf_logprobs(qwen_path)[mask],
                            logprob_gap(qwen_path, sequences(VOCAB)), "logprobs")
    fsdp2 = run_step("fsdp2", qwen_path, VOCAB, world=2)
    fsdp2["grads"].pop("lm_head.weight", None)  # tied: fsdp2 lists the shared tensor once
    assert_same_step(qwen_reference, fsdp2, qwen_path)


LAYOUTS = {
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "tp2-sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "tp2-recompute": {"tensor_model_parallel_size": 2, "recompute_granularity": "full"},
    "tp2-gradient-checkpointing": {"tensor_model_parallel_size": 2, "gradient_checkpointing": True},
    "dp2": {},
    "pp2-4-micro-batches": {"pipeline_model_parallel_size": 2, "micro_batches": 4},
    "tp2-4-micro-batches": {"tensor_model_parallel_size": 2, "micro_batches": 4},
    "dp2-2-micro-batches": {"micro_batches": 2},
    "tp2-fused-loss": {"tensor_model_parallel_size": 2, "use_fused_kernels": True},
    "tp2-sp-fused-loss": {"tensor_model_parallel_size": 2, "sequence_parallel": True, "use_fused_kernels": True,
                          "micro_batches": 2},
    "pp2-fused-loss": {"pipeline_model_parallel_size": 2, "use_fused_kernels": True, "micro_batches": 4},
}


@pytest.fixture(scope="module")
def qwen_layouts(qwen_path):
    """All 2-rank layouts in one process group (one start-up for all of them)."""
    return dict(zip(LAYOUTS, run_steps("megatron", qwen_path, VOCAB, 2, list(LAYOUTS.values())), strict=True))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_parallel_layouts_match_single_rank(qwen_path, qwen_layouts, qwen_reference, layout):
    assert_same_step(qwen_layouts[layout], qwen_reference, qwen_path)


def test_model_parallel_ranks_form_one_data_parallel_shard(qwen_layouts):
    """The driver sends one shard per TP x PP group: DP = world / (TP * PP)."""
    assert {name: result["dp_size"] for name, result in qwen_layouts.items()} == {
        name: 2 if name.startswith("dp2") else 1 for name in LAYOUTS}


def test_tp2_pp2_on_four_workers_matches_fsdp2(qwen_path, qwen_reference):
    """TP=2 x PP=2 (one shard, 4 micro-batches through the 1F1B schedule) against fsdp2 on 2 workers."""
    result = run_step("megatron", qwen_path, VOCAB, world=4, options={
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "micro_batches": 4})
    assert result["dp_size"] == 1
    assert_same_step(result, qwen_reference, qwen_path)
    fsdp2 = run_step("fsdp2", qwen_path, VOCAB, world=2, options={"micro_batches": 2})
    fsdp2["grads"].pop("lm_head.weight", None)  # tied: fsdp2 lists the shared tensor once
    assert_same_step(result, fsdp2, qwen_path)


def test_gradient_checkpointing_means_full_recompute(qwen_layouts, qwen_reference):
    """trainer.gradient_checkpointing reaches megatron as whole-layer recompute; without it nothing recomputes."""
    assert qwen_layouts["tp2-gradient-checkpointing"]["recompute_granularity"] == "full"
    assert qwen_layouts["tp2"]["recompute_granularity"] is None
    assert qwen_reference["recompute_granularity"] is None


def test_expert_parallel_moe_matches_single_rank_and_fsdp2(mixtral_path):
    reference = run_step("megatron", mixtral_path, VOCAB, world=1)
    mask = torch.cat([s["loss_mask"] for s in sequences(VOCAB)])
    tolerances.assert_within(reference["logprobs"][mask], hf_logprobs(mixtral_path)[mask],
                            logprob_gap(mixtral_path, sequences(VOCAB)), "logprobs")
    assert_same_step(run_step("megatron", mixtral_path, VOCAB, world=2,
                              options={"expert_model_parallel_size": 2}), reference, mixtral_path)
    fsdp2 = run_step("fsdp2", mixtral_path, VOCAB, world=2)
    assert_same_step(reference, fsdp2, mixtral_path)


@pytest.fixture(scope="module")
def qwen4_path(tmp_path_factory):
    """Four layers: PP=2 x VP=2 gives each model chunk one."""
    return qwen_model(tmp_path_factory.mktemp("qwen2-4"), hidden=32, layers=4)


INTERLEAVED = {
    "pp2-vp2-4-micro-batches": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
                                "micro_batches": 4},
    # 3 micro-batches: the interleaved schedule runs a multiple of PP, so one empty micro-batch is added
    "pp2-vp2-3-micro-batches": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
                                "micro_batches": 3},
    "pp2-vp2-fused-loss": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
                           "micro_batches": 2, "use_fused_kernels": True},
    "pp2-4-micro-batches": {"pipeline_model_parallel_size": 2, "micro_batches": 4},
}


@pytest.mark.parametrize("layout", INTERLEAVED)
def test_interleaved_pipeline_matches_single_rank(qwen4_path, layout, request):
    """PP=2 with two model chunks per rank (megatron's interleaved 1F1B schedule) against one rank."""
    cache = request.config.cache_interleaved = getattr(request.config, "cache_interleaved", None) or {
        "reference": run_step("megatron", qwen4_path, VOCAB, world=1),
        **dict(zip(INTERLEAVED, run_steps("megatron", qwen4_path, VOCAB, 2, list(INTERLEAVED.values())),
                   strict=True))}
    assert_same_step(cache[layout], cache["reference"], qwen4_path)
