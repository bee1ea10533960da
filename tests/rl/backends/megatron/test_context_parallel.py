"""Context parallelism on the megatron backend (`megatron_config.context_parallel_size`): CP=2 on 2 ranks, with
full recompute, and CP=2 x TP=2 (with sequence parallelism), CP=2 x PP=2 and CP=2 x DP=2 on 4 give the loss,
metrics, logprobs, entropy, gradients and grad norm of CP=1 on one rank, for packed micro-batches whose sequences
cross the slice boundaries."""

import pytest

from tests.rl.backends.megatron.harness import VOCAB, assert_same_step, qwen_model, run_steps

# Three micro-batches of the harness's sequences put a slice boundary inside a sequence in each (one micro-batch of
# all eight would be cut at a sequence boundary); DP=2 cuts one micro-batch per shard inside a sequence as well.
CP2 = {"context_parallel_size": 2, "micro_batches": 3}
LAYOUTS = {
    2: {"cp2": CP2, "cp2-recompute": {**CP2, "recompute_granularity": "full"}},
    4: {"cp2-tp2-sp": {**CP2, "tensor_model_parallel_size": 2, "sequence_parallel": True},
        "cp2-pp2": {**CP2, "pipeline_model_parallel_size": 2},
        "cp2-dp2-one-micro-batch": {"context_parallel_size": 2}},
}


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return qwen_model(tmp_path_factory.mktemp("qwen2"), hidden=64, layers=2)


@pytest.fixture(scope="module")
def results(path) -> dict[str, dict]:
    out = {"cp1": run_steps("megatron", path, VOCAB, 1, [{}])[0]}
    for world, layouts in LAYOUTS.items():
        out.update(zip(layouts, run_steps("megatron", path, VOCAB, world, list(layouts.values())), strict=True))
    return out


@pytest.mark.parametrize("name", [name for layouts in LAYOUTS.values() for name in layouts])
def test_context_parallel_step_matches_one_rank(path, results, name):
    assert_same_step(results[name], results["cp1"], path)
