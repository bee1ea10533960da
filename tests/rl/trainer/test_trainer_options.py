"""Options the README promises, folded into three launcher runs of the tiny job, each option checked by its effect.

- HSDP (fsdp2, `fsdp_size=1` on 2 workers), FSDP1 hybrid sharding (`trainer.strategy=fsdp`, the same size) and
  DeepSpeed ZeRO-1: by what each rank wrote in the run's checkpoint (every tensor whole on a rank for the hybrid
  meshes, where full sharding over 2 ranks splits it in two; ZeRO-1's stage and its optimizer partitions).
- `generator.apply_overlong_filtering`, the overlong penalty (`trainer.algorithm.overlong_buffer`), the `rloo` and
  `reinforce++` estimators, the `sequence_mean` reduction with `gspo` and the `cispo` loss: by the step-1 loss.
  Step 1's rollouts come from the untrained model with the step's seed, so the test replays them in this process
  with the same engine, prompts and sampling parameters (its reward mean and response lengths must equal the
  run's), and computes the loss by hand from them: the penalty's ramp, each estimator's formula, the loss mask and
  the reduction. Step 1 is on-policy (one mini-batch: importance ratio 1) and the policy equals the reference (KL
  0), so loss = pg_loss = that value. Under HSDP the step-1 gradient norm is also checked against that loss
  differentiated here (what each replica applies after the all-reduce).
- `trainer.policy.model.lora.exclude_modules`: by the exported adapter, which holds no adapter for those layers.
- `generator.max_input_length` (multi-turn context limit): episodes end at it (`finish/context`, which the default
  limit of prompt + 2 turns never reaches here), and a step's sequences average no more than it.
"""

import json
import math
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 2
MAX_LENGTH = 12  # the tiny job's generator.max_generate_length
TWO_WORKERS = ["trainer.placement.policy_num_gpus_per_node=2", f"trainer.ckpt_interval={STEPS}"]
U = tolerances.unit_roundoff(torch.float32)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _train(job, run_dir: str, extra: list[str]) -> tuple[list[dict], str]:
    result = run_train(run_dir, [*job.overrides(steps=STEPS), "data.reward_fn=gsm8k_flexible", *TWO_WORKERS, *extra])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "placement: 2 training worker(s)" in result.stdout
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    return rows, result.stdout


def _step_one(job, overrides: list[str]):
    """Step 1's rollouts replayed here: the first prompt batch of seed 42, sampled by the HF engine from the
    untrained model with the step's seed (as the driver samples them, on one torch thread); and each rollout's
    reward from the run's reward function."""
    from transformers import AutoTokenizer

    # registered on import: the strategies the config names, and gsm8k_flexible
    import rl.backends.registry
    import rl.tasks.rewards  # noqa: F401
    from rl.core.config import load_config
    from rl.core.data import iter_batches, load_prompt_dataset
    from rl.core.generation.engine import build_engine
    from rl.core.rewards.functions import call_reward, load_reward_function
    from rl.trainer import components
    from rl.trainer.rewards.rewarding import row_fields

    cfg = load_config([*job.overrides(steps=STEPS), *overrides])
    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    batch = next(iter_batches(load_prompt_dataset([job.train_data]), cfg.trainer.train_batch_size, cfg.trainer.seed))
    prompts = [components.encode_prompt(tokenizer, r, cfg.generator.max_prompt_length) for r in batch.records]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = build_engine("hf", job.model_path, tokenizer, device="cpu")
        seed = cfg.trainer.seed * 100_003 + 1
        rollouts = engine.generate(prompts, components.sampling_params(cfg.generator, seed))
    finally:
        torch.set_num_threads(threads)
    verifier = load_reward_function("gsm8k_flexible")
    scores = []
    for rollout in rollouts:
        record = batch.records[rollout.prompt_index]
        scores.append(call_reward(verifier, rollout.response_text, record.answer, row_fields(record))[0])
    return rollouts, torch.tensor(scores, dtype=torch.float64)


def _mean_gap(values: torch.Tensor) -> float:
    """How far the run's logged mean of `values` (float32 tensors, summed in its own order) can sit from this float64
    mean: each value rounded once to float32, then a reordered sum of len(values) terms."""
    u = tolerances.unit_roundoff(torch.float32)
    return (tolerances.reordered_sum_gap(len(values), float(values.abs().mean()), torch.float32)
            + u * float(values.abs().max()))


def _forward_gap(job, model, rollouts) -> float:
    """`tolerances.logprob_gap` of the untrained model on these rollouts: how far two float32 forwards of it (the
    run's old logprobs and its training forward, or the run's and this process's) can put one token's logprob."""
    with open(os.path.join(job.model_path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    sequences = [torch.tensor([list(r.prompt_ids) + list(r.response_ids)]) for r in rollouts]
    with torch.no_grad():
        largest = max(float(model(ids).logits.abs().max()) for ids in sequences)
    return tolerances.logprob_gap(config, torch.tensor(largest), max(ids.shape[1] for ids in sequences))


def _reductions(job, rollouts, kept) -> list[int]:
    """`tolerances.decoder_reductions` of a step on the kept rollouts (the loss and weight gradients sum over their
    tokens, two data-parallel replicas' halves are averaged: 2 more terms)."""
    with open(os.path.join(job.model_path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r, keep in zip(rollouts, kept, strict=True) if keep]
    return tolerances.decoder_reductions(config, max(lengths), sum(lengths) + 2)


def _group_mean_gap(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """How far the run's float32 leave-one-out advantage (r_i - group mean) * n / (n - 1) of each reward can sit from
    this float64 one: the rewards rounded to float32, the group's n-term mean, the subtraction, the product and the
    division, gamma_(n + 4) of n / (n - 1) * (|r_i| + the group's largest |r|)."""
    gaps = torch.empty_like(rewards)
    for i, group in enumerate(groups.tolist()):
        members = rewards[groups == group]
        n = members.numel()
        gaps[i] = tolerances.gamma(n + 4, torch.float32) * n / (n - 1) * (rewards[i].abs() + members.abs().max())
    return gaps


def _penalty(lengths: torch.Tensor, band: int, factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to MAX_LENGTH - band tokens, then -factor per band tokens, capped."""
    return torch.tensor([-factor * min(1.0, max(0.0, (n - (MAX_LENGTH - band)) / band)) for n in lengths.tolist()],
                        dtype=torch.float64)


def _leave_one_out(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RLOO: each reward minus the mean of the other rewards of its prompt."""
    return torch.stack([rewards[i] - rewards[(groups == groups[i]) & (torch.arange(len(rewards)) != i)].mean()
                        for i in range(len(rewards))])


def _stored_whole(checkpoint_dir: str, prefix: str) -> dict[str, bool]:
    """Name -> whether the checkpoint stores the tensor as one chunk covering all of it (no rank holds a part)."""
    listed = dcp.FileSystemReader(checkpoint_dir).read_metadata().state_dict_metadata
    found = {}
    for name, entry in listed.items():
        if name.startswith(prefix) and hasattr(entry, "chunks"):
            found[name] = len(entry.chunks) == 1 and tuple(entry.chunks[0].sizes) == tuple(entry.size)
    assert found, f"no {prefix} tensors in {checkpoint_dir}"
    return found


def _assert_whole(found: dict[str, bool]) -> None:
    """Every tensor one chunk on one rank: a 1-rank shard group replicated over the 2 workers. Full sharding over 2
    ranks would have stored each tensor as 2 chunks (its first dimension split)."""
    assert all(found.values()), sorted(name for name, whole in found.items() if not whole)[:5]


def test_hsdp_overlong_filtering_penalty_rloo_and_gspo(job, tmp_path):
    """fsdp2 HSDP (2 replicas of a 1-rank shard group); responses cut at 12 tokens are filtered out of the loss and
    penalised over the last 4 tokens; RLOO advantages; gspo with the sequence_mean reduction; SkyRL's
    zero_variance_filter with a tolerance of 1 (a prompt whose responses left in the loss, if more than one, got
    rewards within 1 of each other leaves it: here the uncut responses score 0 or -1, so which prompts leave
    depends on how many of theirs were cut)."""
    band, factor = 4, 1.0
    options = ["trainer.policy.fsdp_config.fsdp_size=1", "generator.apply_overlong_filtering=true",
               f"trainer.algorithm.overlong_buffer.len={band}",
               f"trainer.algorithm.overlong_buffer.penalty_factor={factor}",
               "trainer.algorithm.advantage_estimator=rloo", "trainer.algorithm.policy_loss_type=gspo",
               "trainer.algorithm.loss_reduction=sequence_mean", "trainer.algorithm.zero_variance_filter=true",
               "trainer.algorithm.zero_variance_filter_tol=1.0"]
    run_dir = str(tmp_path / "run")
    rows, _ = _train(job, run_dir, options)
    rollouts, scores = _step_one(job, options)
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float64)
    cut = torch.tensor([r.finish_reason == "length" for r in rollouts])
    groups = torch.tensor([r.prompt_index for r in rollouts])
    rewards = scores + _penalty(lengths, band, factor)
    first = rows[0]
    same_rollouts = pytest.approx(lengths.mean().item(), abs=_mean_gap(lengths))
    assert first["response_length_mean"] == same_rollouts, "the same rollouts"
    assert first["reward_mean"] == pytest.approx(rewards.mean().item(), abs=_mean_gap(rewards)), "reward + penalty"
    assert cut.any() and (~cut).any(), "some responses cut, some not: the filter has something to decide"
    assert (lengths > MAX_LENGTH - band).any(), "some responses inside the penalty band"
    # SkyRL's rule: only the responses still in the loss (not cut) count, and a prompt with one of them is kept
    flat = set()
    for prompt in set(groups.tolist()):
        live = rewards[(groups == prompt) & ~cut].tolist()
        if len(live) > 1 and max(live) - min(live) <= 1.0:
            flat.add(prompt)
    assert flat and len(flat) < len(set(groups.tolist())), "the filter has something to decide"
    assert first["zero_variance_groups"] == len(flat) / len(set(groups.tolist()))
    cut = cut | torch.tensor([prompt in flat for prompt in groups.tolist()])  # out of the loss, either way
    advantages = _leave_one_out(rewards, groups)
    # gspo's per-token loss is -A * (sequence ratio = 1); sequence_mean: the mean over sequences in the loss
    expected = -advantages[~cut].mean().item()
    unfiltered = -advantages.mean().item()
    # The run's sequence ratio exp(mean of logp - old) compares two float32 forwards of the same weights: within
    # e^(+-d) of 1 (`_forward_gap`), its slope |A| r (the clip only flattens it); its float32 advantages within
    # `_group_mean_gap`; its sums over the kept sequences' tokens (the token means, then the sequence mean).
    model = _untrained(job.model_path)
    d = _forward_gap(job, model, rollouts)
    kept_advantages, kept_gaps = advantages[~cut], _group_mean_gap(rewards, groups)[~cut]
    tokens = int(lengths[~cut].sum())
    loss_gap = (float((kept_advantages.abs() * math.expm1(d) + kept_gaps * math.exp(d)).mean())
                + tolerances.reordered_sum_gap(tokens + 4, float(kept_advantages.abs().mean()) * math.exp(d),
                                               torch.float32))
    print(f"gspo step-1 loss: gap {abs(first['pg_loss'] - expected):.3g}, bound {loss_gap:.3g}")
    assert abs(expected - unfiltered) > 10 * loss_gap, "filtering must change the loss"
    assert first["kl"] == 0.0
    assert first["pg_loss"] == pytest.approx(expected, abs=loss_gap)
    assert first["loss"] == pytest.approx(expected, abs=loss_gap)
    # The gradient both replicas apply: the loss above differentiated here in one process (gspo's ratio
    # exp(logp - sg(logp)) has the gradient of logp; the k3 KL's gradient is 0 where policy = reference). A replica
    # that skipped the all-reduce over the replicate dimension would step on half the batch's gradient.
    kept = [(a, lp) for a, lp, dropped in zip(advantages.tolist(), _response_logprobs(model, rollouts), cut.tolist(),
                                             strict=True) if not dropped]
    (-sum(a * lp.mean() for a, lp in kept) / len(kept)).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))
    # The run's gradient differs from this one (i) by rounding: each tensor's `tolerances.gradient_gap` over the
    # step's reductions, in the L2 norm, and the run's float32 norm (its n-term sum of squares, gamma_(n+1) of the
    # squared norm, halved by the square root, which rounds once more; this side's float64 sum adds nothing at this
    # scale); (ii) by its loss weights A_s r_s / S against A_s / S here: each sequence's gradient of its mean
    # logprob scaled by at most |A_s| (e^d - 1) + its advantage's gap times e^d, over S.
    reductions = _reductions(job, rollouts, (~cut).tolist())
    rounding = math.sqrt(sum(g.numel() * tolerances.gradient_gap(g, reductions) ** 2 for g in grads.values()))
    numel = sum(g.numel() for g in grads.values())
    weights = (kept_advantages.abs() * math.expm1(d) + kept_gaps * math.exp(d)).tolist()
    per_sequence = _sequence_gradient_norms(model, [r for r, dropped in zip(rollouts, cut.tolist(), strict=True)
                                                    if not dropped])
    scaled = sum(w * n for w, n in zip(weights, per_sequence, strict=True)) / len(weights)
    norm_gap = rounding + (tolerances.gamma(numel + 1, torch.float32) / 2 + U) * float(norm) + scaled
    print(f"step-1 grad norm {float(norm):.3g}: gap {abs(first['grad_norm'] - float(norm)):.3g}, bound {norm_gap:.3g}")
    assert first["grad_norm"] == pytest.approx(norm.item(), abs=norm_gap)
    checkpoint_dir = os.path.join(run_dir, "checkpoints", f"global_step_{STEPS}")
    _assert_whole(_stored_whole(checkpoint_dir, "model."))


def test_fsdp1_hybrid_lora_exclude_modules_reinforce_plus_plus_and_cispo(job, tmp_path):
    """FSDP1 HYBRID_SHARD (fsdp_size=1 on 2 workers) training LoRA adapters on every linear layer but o_proj and
    down_proj; reinforce++ advantages on a linear overlong penalty (the only nonzero reward of a random model);
    the cispo loss, token_mean reduction."""
    band, factor = MAX_LENGTH - 1, 0.5
    excluded = ("o_proj", "down_proj")
    options = ["trainer.strategy=fsdp", "trainer.policy.fsdp_config.fsdp_size=1", "trainer.policy.model.lora.rank=8",
               f"trainer.policy.model.lora.exclude_modules={list(excluded)}", f"trainer.hf_save_interval={STEPS}",
               f"trainer.algorithm.overlong_buffer.len={band}",
               f"trainer.algorithm.overlong_buffer.penalty_factor={factor}",
               "trainer.algorithm.advantage_estimator=reinforce++", "trainer.algorithm.policy_loss_type=cispo"]
    run_dir = str(tmp_path / "run")
    rows, _ = _train(job, run_dir, options)
    rollouts, scores = _step_one(job, options)
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float64)
    rewards = scores + _penalty(lengths, band, factor)
    first = rows[0]
    same_rollouts = pytest.approx(lengths.mean().item(), abs=_mean_gap(lengths))
    assert first["response_length_mean"] == same_rollouts, "the same rollouts"
    assert first["reward_mean"] == pytest.approx(rewards.mean().item(), abs=_mean_gap(rewards))
    # reinforce++ with gamma 1: every token of response i carries r_i; whitened over all response tokens (unbiased)
    tokens = torch.repeat_interleave(rewards, lengths.long())
    mean, std = tokens.mean(), tokens.var(unbiased=True).add(1e-8).sqrt()
    advantages = (rewards - mean) / std
    model = _untrained(job.model_path)
    with torch.no_grad():  # the adapters start at B = 0: the base model's logprobs
        logprobs = _response_logprobs(model, rollouts)
    # cispo at ratio 1: -A * logp per token; token_mean over every response token (no filtering here)
    expected = -sum(a * lp.sum() for a, lp in zip(advantages.tolist(), logprobs, strict=True)) / lengths.sum()
    # The run's terms -A clip(r) logp: its logprobs within d of these and its ratio (two forwards of its weights)
    # within e^(+-d) of 1 (`_forward_gap`; the adapters add exactly 0 at B = 0); its float32 whitening within
    # gamma_(N + 6) of (|r_i| + max|r|) / std + |A_i| (the N-token mean and variance, the square root, the
    # subtraction and the division); its token mean's own N-term sum.
    d = _forward_gap(job, model, rollouts)
    n = int(lengths.sum())
    a_gaps = tolerances.gamma(n + 6, torch.float32) * ((rewards.abs() + rewards.abs().max()) / std
                                                       + advantages.abs())
    per_token = [(a.abs() * (d * math.exp(d) + lp.abs() * math.expm1(d)) + g * math.exp(d) * (lp.abs() + d)).sum()
                 for a, g, lp in zip(advantages, a_gaps, logprobs, strict=True)]
    magnitude = sum((a.abs() * math.exp(d) * (lp.abs() + d)).sum() for a, lp in zip(advantages, logprobs,
                                                                                    strict=True))
    loss_gap = float(sum(per_token) / n + tolerances.reordered_sum_gap(n + 4, magnitude / n, torch.float32))
    print(f"cispo step-1 loss: gap {abs(first['pg_loss'] - float(expected)):.3g}, bound {loss_gap:.3g}")
    assert first["kl"] == 0.0
    assert first["pg_loss"] == pytest.approx(float(expected), abs=loss_gap)
    assert first["loss"] == pytest.approx(float(expected), abs=loss_gap)

    export = os.path.join(run_dir, "exports", f"global_step_{STEPS}")
    adapters = load_file(os.path.join(export, "adapter_model.safetensors"))
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapters if ".lora_" in name}
    assert adapted == {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}, sorted(adapted)
    assert any(tensor.abs().max() > 0 for name, tensor in adapters.items() if ".lora_B." in name), "B left 0"
    with open(os.path.join(export, "adapter_config.json")) as f:
        assert sorted(json.load(f)["exclude_modules"]) == sorted(excluded)
    checkpoint_dir = os.path.join(run_dir, "checkpoints", f"global_step_{STEPS}")
    found = _stored_whole(checkpoint_dir, "model.")
    assert all(".lora_" in name for name in found), "a LoRA checkpoint holds the adapters only"
    _assert_whole(found)


def _response_logprobs(model, rollouts) -> list[torch.Tensor]:
    """log p(token) of each response token under `model` at temperature 1, one sequence at a time."""
    found = []
    for rollout in rollouts:
        ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.response_ids)])
        logits = model(ids).logits[0, :-1].double()
        token = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        found.append(token[len(rollout.prompt_ids) - 1:])
    return found


def _sequence_gradient_norms(model, rollouts) -> list[float]:
    """The L2 norm of the gradient of each rollout's mean response logprob."""
    norms = []
    for rollout in rollouts:
        model.zero_grad(set_to_none=True)
        _response_logprobs(model, [rollout])[0].mean().backward()
        norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()
                                   if p.grad is not None)))
    model.zero_grad(set_to_none=True)
    return norms


def _untrained(model_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


def test_zero1_and_the_multi_turn_context_limit(job, tmp_path):
    """DeepSpeed ZeRO-1 on 2 workers; `arith_retry` episodes of up to 2 turns within max_input_length tokens; a
    checkpoint every step, one kept (SkyRL's max_ckpts_to_keep)."""
    limit = 40
    options = ["trainer.strategy=deepspeed", "deepspeed_config.train.zero_optimization.stage=1",
               "environment.env_class=arith_retry", "generator.max_turns=2", f"generator.max_input_length={limit}",
               "trainer.ckpt_interval=1", "trainer.max_ckpts_to_keep=1"]
    run_dir = str(tmp_path / "run")
    rows, stdout = _train(job, run_dir, options)
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == [f"global_step_{STEPS}"]
    assert f"checkpoints: removed global_step_{STEPS - 1} (trainer.max_ckpts_to_keep=1)" in stdout
    for row in rows:
        # 16 episodes (prompt + all turns) of at most `limit` tokens each; some end at the limit
        tokens = row["tokens_per_s"] * row["step_time_s"]
        assert tokens <= 16 * limit + 0.5, row
    assert any(row.get("finish/context", 0) > 0 for row in rows), rows
    state = os.path.join(run_dir, "checkpoints", f"global_step_{STEPS}", "state")
    shards = [torch.load(os.path.join(state, f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"), weights_only=False)
              for rank in range(2)]
    assert all(int(s["optimizer_state_dict"]["zero_stage"]) == 1 for s in shards)
    total = sum(p.numel() for p in _untrained(job.model_path).parameters())
    partitions = [sum(t.numel() for t in s["optimizer_state_dict"]["single_partition_of_fp32_groups"])
                  for s in shards]
    # each rank holds its half of the fp32 master weights (DeepSpeed pads a group to a multiple of the ranks)
    assert sum(partitions) >= total and max(partitions) - min(partitions) <= 2, (partitions, total)
    assert max(partitions) <= total // 2 + 64, (partitions, total)
