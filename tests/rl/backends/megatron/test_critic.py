"""The critic (value model) under megatron with TP=2, PP=2 (two micro-batches through the 1F1B schedule), TP=2 with
sequence parallelism, TP=PP=1 x DP=2 and CP=2 (2 gloo processes, one spawn for all five), against an independent
plain-torch oracle: transformers' causal LM with `attach_value_head`'s head in place of the LM head, each sequence
alone through it, the value loss of `compute_value_loss` with the same settings, torch's AdamW with the same
hyper-parameters and clipping, all within float32 rounding (`tests.testing.tolerances`):
- the values before the first update and the first step's value loss, metrics, gradients and grad norm against the
  oracle's; the head's gradient is the same on every TP rank;
- the weights after each of the two steps against the oracle's within Adam's bound (`tolerances.adam_gap`), and
  megatron's values after each update, and the second step's loss, against transformers on those weights;
- the export loads as a token classifier and a critic started from it keeps the trained head; the checkpoint
  converts to a token classifier and resumes exactly; the policy-only fused loss is refused (a LoRA critic
  is checked against fsdp2's in tests/rl/trainer/test_critic_training.py)."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from rl.backends.base import ModelSpec
from rl.backends.dist import DistInfo
from rl.backends.value_head import attach_value_head
from rl.core.algorithms import LossNormalizer
from rl.core.algorithms.value_loss import ValueLossSettings, clipped_value_loss, compute_value_loss
from rl.core.packing import pack_sequences
from tests.rl.backends.megatron.harness import (
    VOCAB,
    _gather_grad_buffers,
    qwen_model,
    reported,
    sequences,
    step_reductions,
)
from tests.testing import tolerances
from tests.testing.rendezvous import join, rendezvous

LR = 1e-2
MAX_GRAD_NORM = 1.0
STEPS = 2
CLIP = 0.05  # small enough that the clipped term decides for some tokens at the second step
SETTINGS = ValueLossSettings(value_clip=CLIP, loss_reduction="token_mean")
F32 = torch.float32
LAYOUTS = {
    # and a critic started from the export of the trained one (a token classifier) keeps its head
    "tp2": {"tensor_model_parallel_size": 2, "restart_from_export": True},
    "pp2": {"pipeline_model_parallel_size": 2, "micro_batches": 2},
    "tp2-sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "dp2": {},  # TP = PP = 1, two data-parallel shards
    # each rank runs half of every packed row; three micro-batches put a slice boundary inside a sequence in each
    "cp2": {"context_parallel_size": 2, "micro_batches": 3},
}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return qwen_model(tmp_path_factory.mktemp("qwen2"), hidden=64, layers=2)


def _critic_model(path: str, state: dict[str, torch.Tensor] | None = None):
    """transformers' causal LM at `path` with the value head every strategy starts from (`attach_value_head`); with
    `state`, these weights instead (HF names, the head as `lm_head.*`)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=F32)
    attach_value_head(model, path)
    if state is not None:
        model.load_state_dict(state)
    return model


def _values(model, seqs: list[dict], capture: list | None = None) -> torch.Tensor:
    """[N] values of the sequences, each alone through `model`: token t gets the head's output at position t - 1,
    on loss tokens (0 elsewhere). `capture` receives each sequence's head input."""
    out = []
    for seq in seqs:
        hook = model.lm_head.register_forward_hook(lambda _m, args, _o: capture.append(args[0][0].detach())
                                                   if capture is not None else None)
        scores = model(input_ids=seq["input_ids"][None]).logits[0, :, 0]
        hook.remove()
        out.append(torch.cat([scores.new_zeros(1), scores[:-1]]) * seq["loss_mask"])
    return torch.cat(out)


def _reference(model, seqs: list[dict]) -> dict:
    """What megatron's critic must give with `model`'s weights: its values, their gap bound (`network_rtol` of the
    forward's reductions relative to the head's sum of |terms|, sum |w h| + |b|, at its largest over the tokens: the
    magnitude a value's rounding scales with), and the value loss's metrics (`compute_value_loss`)."""
    captured: list = []
    with torch.no_grad():
        values = _values(model.eval(), seqs, captured)
    head_w, head_b = model.lm_head.weight.detach().abs(), model.lm_head.bias.detach().abs()
    scale = max(float((hidden.abs() @ head_w.t() + head_b).max()) for hidden in captured)
    gap = tolerances.network_rtol(step_reductions(model.config, seqs, backward=False), F32) * scale
    batch = pack_sequences(seqs)
    loss, metrics = compute_value_loss(SETTINGS, values, batch.old_values, batch.returns, batch.loss_mask,
                                       _normalizer(seqs), seq_ids=batch.token_seq_ids(), num_sequences=len(seqs))
    return {"values": values, "gap": gap,
            "metrics": {"loss": float(loss), **{name: float(value) for name, value in metrics.items()}}}


def _normalizer(seqs: list[dict], dp: int = 1) -> LossNormalizer:
    tokens = sum(int(s["loss_mask"].sum()) for s in seqs)
    return LossNormalizer.from_counts("token_mean", tokens, len(seqs), dp_world_size=dp)


def _metric_bounds(values: torch.Tensor, d: float, seqs: list[dict], clipfrac: float) -> dict[str, float]:
    """Bounds of the mini-batch metrics when every loss token's value may move by d: the per-token loss 0.5 x^2
    (x = V - R, or the clipped V's; clipping moves it by at most d too) by at most (|x| + d) d; values_mean by d;
    vf_clipfrac may count differently the tokens whose two squares lie within the change d can make to their
    difference (ties included); each N-term mean adds 2 gamma_N of its terms' magnitude."""
    mask = torch.cat([s["loss_mask"] for s in seqs])
    old = torch.cat([s["old_values"] for s in seqs])[mask].double()
    returns = torch.cat([s["returns"] for s in seqs])[mask].double()
    v, n = values[mask].double(), int(mask.sum())
    two_gamma = 2 * tolerances.gamma(n, F32)
    clipped_v = old + (v - old).clamp(-CLIP, CLIP)
    x = torch.maximum((v - returns).abs(), (clipped_v - returns).abs())
    per_token, _ = clipped_value_loss(v, old, returns, CLIP)
    near = ((clipped_v - returns) ** 2 - (v - returns) ** 2).abs() <= 2 * (2 * x + 2 * d) * d
    loss = float(((x + d) * d).sum() + two_gamma * per_token.sum()) / n
    return {"vf_loss": loss, "loss": loss, "values_mean": d + float(two_gamma * v.abs().sum()) / n,
            "vf_clipfrac": float(near.sum()) / n + two_gamma * clipfrac}


def _grad_gaps(grad: torch.Tensor, reductions: list[int], norm: float, norm_gap: float, clipped: bool
               ) -> torch.Tensor:
    """Per-element bound on a clipped gradient's gap: the unclipped gradient's rounding (`gradient_gap`, scaled by
    the clip factor like the gradient) plus, when clipped, the clip factor's relative error (that of the norm)
    times the element."""
    gap = torch.full_like(grad, tolerances.gradient_gap(grad, reductions), dtype=torch.float64)
    return gap + (norm_gap / norm) * grad.double().abs() if clipped else gap


def _norm_gap(grads: dict[str, torch.Tensor], reductions: list[int], norm: float, factor: float) -> float:
    """Gap of the global grad norm (as `harness.assert_same_step`): the unclipped gradients' gaps in the L2 norm,
    plus gamma_n of the norm for its own n-term sum of squares; `factor` is the clip factor the grads carry."""
    gaps = {name: tolerances.gradient_gap(g, reductions) / factor for name, g in grads.items()}
    numel = sum(g.numel() for g in grads.values())
    return (math.sqrt(sum(grads[n].numel() * gap**2 for n, gap in gaps.items()))
            + tolerances.gamma(numel, F32) * norm)


def _weight_gaps(state: dict[str, torch.Tensor], grads: list[dict], grad_gaps: list[dict], steps: int
                 ) -> dict[str, torch.Tensor]:
    """Per-element bound on two runs' weights after `steps` AdamW steps from the same start whose gradients differ by
    at most `grad_gaps`: `tolerances.adam_gap` (a weight gap feeding the next step's gradients enters its gap only
    to second order, as in test_lora), plus each run's rounding of each write of the weight."""
    writes = 2 * tolerances.ADAM_WRITES_PER_STEP * steps * tolerances.unit_roundoff(F32)
    return {name: tolerances.adam_gap([g[name] for g in grads[:steps]], [r[name] for r in grad_gaps[:steps]], LR)
            + writes * w.detach().abs().double() for name, w in state.items()}


@pytest.fixture(scope="module")
def oracle(model_path) -> dict:
    """The plain-torch run: `_reference` before the first update; per step the clipped gradients, their gap bounds
    and the grad norm; the weights after each step with their bounds."""
    seqs = sequences(VOCAB)
    g = torch.Generator().manual_seed(1)
    model = _critic_model(model_path)
    with torch.no_grad():
        initial = _values(model.eval(), seqs)
    start = 0
    for seq in seqs:  # the values before the update are the old ones of every step (PPO epochs over one batch)
        n = len(seq["input_ids"])
        seq["old_values"], start = initial[start:start + n].clone(), start + n
        seq["returns"] = torch.randn(n, generator=g) * seq["loss_mask"]
    run: dict = {"seqs": seqs, "before": _reference(model, seqs), "grads": [], "grad_gaps": [], "norms": [],
                 "clipped": [], "states": [], "weight_gaps": []}
    batch = pack_sequences(seqs)
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(params.values(), lr=LR, weight_decay=0.0)
    reductions = step_reductions(model.config, seqs)
    for step in range(STEPS):
        values = _values(model.train(), seqs)
        loss, _ = compute_value_loss(SETTINGS, values, batch.old_values, batch.returns, batch.loss_mask,
                                     _normalizer(seqs), seq_ids=batch.token_seq_ids(), num_sequences=len(seqs))
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params.values(), MAX_GRAD_NORM))
        factor = min(1.0, MAX_GRAD_NORM / (norm + 1e-6))
        grads = {name: p.grad.detach().clone() for name, p in params.items()}
        norm_gap = _norm_gap(grads, reductions, norm, factor)
        run["grad_gaps"].append({name: _grad_gaps(grad, reductions, norm, norm_gap, factor < 1)
                                 for name, grad in grads.items()})
        run["grads"].append(grads)
        run["norms"].append((norm, norm_gap))
        run["clipped"].append(factor < 1)
        optimizer.step()
        optimizer.zero_grad()
        run["states"].append({name: t.detach().clone() for name, t in model.state_dict().items()})
        run["weight_gaps"].append(_weight_gaps(run["states"][-1], run["grads"], run["grad_gaps"], step + 1))
    return run


# --- the megatron runs ---------------------------------------------------------------------------------------------
def _shards(seqs: list[dict], dp: int, micro_batches: int):
    per_shard = len(seqs) // dp
    out = []
    for shard in range(dp):
        mine = seqs[shard * per_shard:(shard + 1) * per_shard]
        per_micro = -(-len(mine) // micro_batches)
        out.append([pack_sequences(mine[m * per_micro:(m + 1) * per_micro]) for m in range(micro_batches)])
    return out


def _full_grads(critic) -> dict[str, torch.Tensor]:
    """The reduced (and clipped) gradients under HF names on rank 0 (collective)."""
    from rl.backends.megatron.checkpoint import gather_shards
    from rl.backends.megatron.convert import megatron_to_hf

    for chunk in critic.ddp:
        _gather_grad_buffers(chunk)
    shards = gather_shards([{n: p.main_grad.clone() for n, p in c.named_parameters()} for c in critic.chunks],
                           critic.layout)
    layout = critic.layout
    return megatron_to_hf(shards, critic.hf_config, layout.tp, layout.pp, layout.ep, value_head=True) if shards else {}


def _head_copies(critic) -> list:
    """(tp_rank, pp_rank, data-parallel index, weight grad, bias grad, tensor-parallel attribute) of the head on every
    rank that holds one, from the accumulated gradients before megatron reduces them (collective)."""
    from megatron.core import parallel_state as ps

    from rl.backends.megatron.critic import ValueHead

    head = getattr(critic.chunks[-1], "output_layer", None)
    mine = None
    if isinstance(head, ValueHead):
        mine = (critic.layout.tp_rank, critic.layout.pp_rank, ps.get_data_parallel_rank(),
                head.weight.main_grad.clone(), head.bias.main_grad.clone(),
                getattr(head.weight, "tensor_model_parallel", False))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return [e for e in everyone if e is not None]


def _summed(metrics, layout) -> dict[str, float]:
    total: dict[str, float] = {}
    for shard in reported(metrics, layout):
        for name, value in shard.items():
            total[name] = total.get(name, 0.0) + value
    return total


def _all_values(critic, mine, layout) -> torch.Tensor:
    return torch.cat([v for shard in reported(critic.values_micro_batches(mine), layout) for v in shard])


def _one_layout(info, options: dict, model_path: str, seqs: list[dict], directory: str) -> dict:
    """Two steps of a critic in the `options` layout as the driver runs them (each data-parallel shard's sequences to
    its ranks, results from the reporting ranks); then a checkpoint, and one more step of the critic and of a fresh
    one restored from it."""
    from megatron.core import parallel_state

    from rl.backends.registry import build_backend

    torch.manual_seed(0)
    options = dict(options)
    micro_batches, restart = options.pop("micro_batches", 1), options.pop("restart_from_export", False)
    spec = ModelSpec(path=model_path, role="critic", temperature=1.0, lr=LR, weight_decay=0.0,
                     max_grad_norm=MAX_GRAD_NORM, backend_options=options)
    critic = build_backend("megatron", spec, info)
    layout = critic.data_parallel_rank()
    mine = _shards(seqs, layout.size, micro_batches)[layout.index]
    normalizer = _normalizer(seqs, layout.size)
    grads: list = []
    update = critic.optimizer.step

    def step_after_reading_grads():  # the gradients the update takes, after megatron's reduction and clipping
        if not grads:
            grads.append(_full_grads(critic))
        update()

    critic.optimizer.step = step_after_reading_grads
    out: dict = {"values": [], "metrics": [], "norms": [], "states": [], "dp_size": layout.size}
    for step in range(STEPS):
        out["values"].append(_all_values(critic, mine, layout))
        metrics = critic.train_micro_batches(mine, SETTINGS, normalizer)
        if step == 0:
            out["heads"] = _head_copies(critic)
        out["metrics"].append(_summed(metrics, layout))
        out["norms"].append(critic.optimizer_step()["grad_norm"])
        out["states"].append(critic.full_state_dict())
    out["values"].append(_all_values(critic, mine, layout))
    out["grads"] = grads[0]
    if restart:
        from rl.backends.hf_model import save_hf_checkpoint

        export = os.path.join(directory, "export")
        if info.rank == 0:
            save_hf_checkpoint(model_path, dict(out["states"][-1]), export, critic=True)
        dist.barrier()
        out["restarted"] = _all_values(build_backend("megatron", replace(spec, path=export), info), mine, layout)
    checkpoint = os.path.join(directory, "checkpoint")
    critic.save_checkpoint(checkpoint)
    resumed = build_backend("megatron", spec, info)
    resumed.load_checkpoint(checkpoint)
    out["checkpoint"] = checkpoint
    for backend, key in ((critic, "continued"), (resumed, "resumed")):
        metrics = _summed(backend.train_micro_batches(mine, SETTINGS, normalizer), layout)
        out[key] = (metrics, backend.optimizer_step(), backend.full_state_dict())
    parallel_state.destroy_model_parallel()
    return out


def _worker(rank: int, world: int, port: int, layouts: dict, model_path: str, seqs: list[dict], directory: str
            ) -> None:
    torch.set_num_threads(1)
    info = join(rank, world, port)
    results = [_one_layout(info, options, model_path, seqs, os.path.join(directory, name))
               for name, options in layouts.items()]
    if rank == 0:
        torch.save(results, os.path.join(directory, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(model_path, oracle, tmp_path_factory) -> dict[str, dict]:
    """Every layout in one group of 2 processes (one start-up for all of them)."""
    directory = str(tmp_path_factory.mktemp("runs"))
    with rendezvous(2) as port:
        mp.spawn(_worker, args=(2, port, LAYOUTS, model_path, oracle["seqs"], directory), nprocs=2)
    return dict(zip(LAYOUTS, torch.load(os.path.join(directory, "result.pt"), weights_only=False), strict=True))


# --- the comparisons -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_and_value_loss_match_the_oracle(runs, oracle, model_path, layout):
    """Before the first update against the oracle; after each update against transformers on the weights megatron
    has then (which `test_weights_after_each_step_match_the_oracle...` holds to the oracle's within Adam's bound):
    the values, and the value loss's metrics of the step that starts there."""
    run, seqs = runs[layout], oracle["seqs"]
    assert run["dp_size"] == (2 if layout == "dp2" else 1)
    mask = torch.cat([s["loss_mask"] for s in seqs])
    references = [oracle["before"]] + [_reference(_critic_model(model_path, state), seqs) for state in run["states"]]
    for step, (got, want) in enumerate(zip(run["values"], references, strict=True)):
        assert torch.equal(got[~mask], torch.zeros_like(got[~mask])), "no value off the loss mask"
        tolerances.assert_within(got[mask], want["values"][mask], want["gap"], f"values after {step} updates")
    for step, (got, want) in enumerate(zip(run["metrics"], references[:STEPS], strict=True)):
        bounds = _metric_bounds(want["values"], want["gap"], seqs, want["metrics"]["vf_clipfrac"])
        assert got.keys() == want["metrics"].keys()
        for name, value in want["metrics"].items():
            tolerances.assert_within(torch.tensor(got[name]), torch.tensor(value), bounds[name],
                                     f"{name}, step {step + 1}")
    assert references[1]["metrics"]["vf_clipfrac"] > 0, "the clipped term decided for some tokens at step 2"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_first_step_gradients_and_grad_norm_match_the_oracle(runs, oracle, layout):
    """The head's gradient is the same on every TP rank before megatron touches it; its parameters are not marked
    tensor-parallel (the grad norm counts them once); the reduced gradients and the norm are the oracle's."""
    run = runs[layout]
    heads = run["heads"]
    assert sorted((tp, pp, dp) for tp, pp, dp, *_ in heads) == {
        "tp2": [(0, 0, 0), (1, 0, 0)], "tp2-sp": [(0, 0, 0), (1, 0, 0)], "pp2": [(0, 1, 0)],
        "dp2": [(0, 0, 0), (0, 0, 1)], "cp2": [(0, 0, 0), (0, 0, 1)]}[layout]
    for _, _, dp, weight, bias, parallel in heads:
        assert not parallel
        first = next(h for h in heads if h[2] == dp)  # the TP ranks of one DP (or CP) rank saw the same tokens
        assert torch.equal(weight, first[3]) and torch.equal(bias, first[4]), "TP ranks' head gradients"
    norm, norm_gap = oracle["norms"][0]
    tolerances.assert_within(torch.tensor(run["norms"][0]), torch.tensor(norm), norm_gap, "grad norm")
    assert oracle["clipped"][0], "the first step clips (the norm decides every gradient)"
    want = oracle["grads"][0]
    assert run["grads"].keys() == want.keys()
    for name, grad in want.items():
        tolerances.assert_within(run["grads"][name], grad, oracle["grad_gaps"][0][name], name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_after_each_step_match_the_oracle_and_export_as_a_classifier(runs, oracle, model_path, layout,
                                                                             tmp_path):
    from rl.backends.hf_model import save_hf_checkpoint

    run = runs[layout]
    initial = _critic_model(model_path).state_dict()
    for step, (got, want, gaps) in enumerate(zip(run["states"], oracle["states"], oracle["weight_gaps"],
                                                 strict=True)):
        assert got.keys() == want.keys()
        for name, value in want.items():
            tolerances.assert_within(got[name], value, gaps[name], f"{name} after {step + 1} steps")
    head = oracle["states"][-1]["lm_head.weight"]
    assert ((head - initial["lm_head.weight"]).abs() > oracle["weight_gaps"][-1]["lm_head.weight"]).all(), (
        "every element of the head moved further than its bound")
    folder = str(tmp_path / "export")
    state = run["states"][-1]
    save_hf_checkpoint(model_path, dict(state), folder, critic=True)
    loaded = AutoModelForTokenClassification.from_pretrained(folder, dtype=F32).eval()
    assert torch.equal(loaded.score.weight, state["lm_head.weight"])
    assert torch.equal(loaded.score.bias, state["lm_head.bias"])
    mask = torch.cat([s["loss_mask"] for s in oracle["seqs"]])
    with torch.no_grad():
        exported = _classifier_values(loaded, oracle["seqs"])
    gap = _reference(_critic_model(model_path, state), oracle["seqs"])["gap"]
    tolerances.assert_within(exported[mask], run["values"][-1][mask], gap, "the export's values")


def _classifier_values(model, seqs: list[dict]) -> torch.Tensor:
    return torch.cat([torch.cat([torch.zeros(1), model(input_ids=s["input_ids"][None]).logits[0, :-1, 0]])
                      * s["loss_mask"] for s in seqs])


def test_a_critic_started_from_its_export_keeps_the_trained_head(runs):
    """`trainer.critic.model.path` at an exported critic: megatron builds the same critic (its `score.*` head, not a
    new one), which gives the trained critic's values exactly (same weights, same layout)."""
    run = runs["tp2"]
    assert torch.equal(run["restarted"], run["values"][-1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_resumes_exactly_and_converts_to_a_classifier(runs, model_path, layout, tmp_path):
    from rl.backends.megatron.hf_io import megatron_checkpoint_to_hf, megatron_weights

    run = runs[layout]
    (metrics, step, state), (got_metrics, got_step, got_state) = run["continued"], run["resumed"]
    saved = run["states"][-1]
    assert got_metrics == metrics and got_step == step
    assert got_state.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(got_state[name], tensor), name
    converted = megatron_weights(run["checkpoint"], model_path)
    assert converted.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(converted[name], tensor), name
    folder = str(tmp_path / "converted")
    megatron_checkpoint_to_hf(run["checkpoint"], folder)
    loaded = AutoModelForTokenClassification.from_pretrained(folder, dtype=F32)
    assert torch.equal(loaded.score.weight, saved["lm_head.weight"])
    assert torch.equal(loaded.score.bias, saved["lm_head.bias"])


def test_the_policy_only_fused_loss_is_refused(model_path):
    from rl.backends.megatron.backend import MegatronBackend

    spec = ModelSpec(path=model_path, role="critic", temperature=1.0, fused_kernels=True)
    with pytest.raises(ValueError, match=r"trainer\.policy\.use_fused_kernels"):
        MegatronBackend(spec, DistInfo(rank=0, world_size=1, device=torch.device("cpu"))).build()
