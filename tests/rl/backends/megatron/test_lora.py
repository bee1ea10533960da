"""LoRA on the megatron backend under TP=2 (with and without sequence parallelism, with the optimizer offloaded),
PP=2 (and VP=2), DP=2, on one rank, and on Mixtral's attention under EP=2, against transformers + PEFT as the
oracle: the adapters start as PEFT's, three steps give PEFT's losses and adapter weights, base weights stay
bit-identical, the reference (adapters off) is the base model, merged weights are PEFT's merge, the adapters
gathered from the TP/PP shards load in `PeftModel`, and a checkpoint of the adapters alone resumes exactly and
converts (merged) to HF weights."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from peft import PeftModel
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rl.backends.hf_forward import batch_logprobs, scored_logits
from rl.backends.lora import adapters_disabled, add_lora, save_adapter
from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import pack_sequences
from tests.rl.backends.megatron.harness import (
    logprob_gap,
    reported,
    sequences,
    shard_batches,
    step_reductions,
)
from tests.testing import loss_gaps, tolerances
from tests.testing.backend_steps import oracle_step
from tests.testing.rendezvous import join, rendezvous

VOCAB = 61
LORA = dict(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"],
            exclude_modules=None, init_method="gaussian", merge_on_export=False)
# Mixtral's experts are fused 3-D tensors in transformers, not linear layers: PEFT (and so every strategy) adapts
# its attention
MOE_LORA = dict(LORA, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
SETTINGS = LossSettings(use_kl_loss=False)
LR, STEPS = 1e-2, 3
# name -> (model, megatron_config); the first runs on one rank, the others on two
LAYOUTS = {"single": ("qwen", {}),
           "tp2": ("qwen", {"tensor_model_parallel_size": 2}),
           "tp2-sp": ("qwen", {"tensor_model_parallel_size": 2, "sequence_parallel": True}),
           "pp2": ("qwen", {"pipeline_model_parallel_size": 2}),
           "pp2-vp2": ("qwen", {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}),
           "dp2": ("qwen", {}),
           "tp2-optimizer-offload": ("qwen", {"tensor_model_parallel_size": 2, "optimizer_cpu_offload": True}),
           "mixtral-ep2": ("mixtral", {"expert_model_parallel_size": 2})}


def _models(directory: str) -> dict[str, tuple[str, dict]]:
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  pad_token_id=0, max_position_embeddings=64)
    qwen = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=96, tie_word_embeddings=True, **common))
    mixtral = MixtralForCausalLM(MixtralConfig(hidden_size=32, intermediate_size=48, head_dim=8, num_local_experts=4,
                                               num_experts_per_tok=2, tie_word_embeddings=False, **common))
    out = {}
    for name, model, lora in (("qwen", qwen, LORA), ("mixtral", mixtral, MOE_LORA)):
        model.save_pretrained(os.path.join(directory, name))
        out[name] = (os.path.join(directory, name), lora)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    return _models(str(tmp_path_factory.mktemp("models")))


def _step(backend, shard, layout, tokens: int) -> float:
    """One on-policy step: old logprobs from the backend itself; the summed loss of every shard."""
    old = reported(backend.logprobs_micro_batches(shard), layout)  # every shard's, on every rank
    batches = [b.replace(old_logprobs=lp) for b, lp in zip(shard, old[layout.index], strict=True)]
    normalizer = LossNormalizer.from_counts("token_mean", tokens, len(sequences(VOCAB)), dp_world_size=layout.size)
    metrics = backend.train_micro_batches(batches, SETTINGS, normalizer)
    backend.optimizer_step()
    return sum(m["loss"] for m in reported(metrics, layout))


def _run_layout(info, options: dict, path: str, lora: dict, directory: str) -> dict:
    from megatron.core import parallel_state

    from rl.backends.base import ModelSpec
    from rl.backends.registry import build_backend

    def build():
        torch.manual_seed(0)
        spec = ModelSpec(path=path, role="policy", temperature=1.0, lr=LR, lora=lora, backend_options=options)
        return build_backend("megatron", spec, info)

    backend = build()
    layout = backend.data_parallel_rank()
    shards, seqs = shard_batches(VOCAB, layout.size)
    tokens = sum(int(s["loss_mask"].sum()) for s in seqs)
    whole = pack_sequences(seqs)
    out = {"initial": backend.adapter_state_dict(), "base": backend.full_state_dict()}
    with backend.reference_view():
        out["reference"] = reported(backend.logprobs(whole)[0], layout)[0]
    losses = [_step(backend, shards[layout.index], layout, tokens) for _ in range(STEPS - 1)]
    checkpoint = os.path.join(directory, "ckpt")
    backend.save_checkpoint(checkpoint)
    out["checkpointed"] = backend.adapter_state_dict()
    losses.append(_step(backend, shards[layout.index], layout, tokens))
    out.update(losses=losses, adapters=backend.adapter_state_dict(), merged=backend.full_state_dict(),
               logprobs=reported(backend.logprobs(whole)[0], layout)[0], checkpoint=checkpoint)
    parallel_state.destroy_model_parallel()
    resumed = build()
    resumed.load_checkpoint(checkpoint)
    out["resumed_loss"] = _step(resumed, shards[layout.index], layout, tokens)
    out["resumed_adapters"] = resumed.adapter_state_dict()
    parallel_state.destroy_model_parallel()
    return out


def _worker(rank: int, world: int, port: int, layouts: dict, models: dict, directory: str) -> None:
    torch.set_num_threads(1)
    info = join(rank, world, port)
    results = {name: _run_layout(info, options, *models[model], os.path.join(directory, name))
               for name, (model, options) in layouts.items()}
    if rank == 0:
        torch.save(results, os.path.join(directory, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory) -> dict[str, dict]:
    results = {}
    names = list(LAYOUTS)
    for world, group in ((1, names[:1]), (2, names[1:])):
        directory = str(tmp_path_factory.mktemp(f"world{world}"))
        layouts = {name: LAYOUTS[name] for name in group}
        with rendezvous(world) as port:
            mp.spawn(_worker, args=(world, port, layouts, models, directory), nprocs=world)
        results.update(torch.load(os.path.join(directory, "result.pt"), weights_only=False))
    return results


def _own_names(adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PEFT adapter-file names -> the adapted model's (`...q_proj.lora_A.default.weight`)."""
    return {name.removeprefix("base_model.model.").replace(".weight", ".default.weight"): t
            for name, t in adapters.items()}


def _oracle(model_path: str, lora: dict) -> dict:
    """transformers + PEFT from the same seed: its adapters, and three steps of plain torch on every sequence."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    add_lora(model, lora, model_path)
    initial = {n: t.clone() for n, t in model.state_dict().items() if "lora_" in n}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    grads = {names[id(p)]: [] for p in trainable}  # the clipped gradients of every step, as Adam sees them

    def record_gradients(*_):
        for p in trainable:
            grads[names[id(p)]].append(p.grad.clone())

    optimizer.register_step_pre_hook(record_gradients)
    seqs = sequences(VOCAB)
    whole = pack_sequences(seqs)
    with torch.no_grad(), adapters_disabled(model):
        reference, _ = batch_logprobs(model.eval(), whole, 1.0, False)
    losses = []
    for _ in range(STEPS):
        with torch.no_grad():
            old, _ = batch_logprobs(model.eval(), whole, 1.0, False)
        batch = whole.replace(old_logprobs=old)
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), len(seqs))
        losses.append(oracle_step(model, batch, SETTINGS, normalizer, trainable, optimizer))
    with torch.no_grad():
        logprobs, _ = batch_logprobs(model.eval(), whole, 1.0, False)
    state = model.state_dict()
    return {"initial": initial, "losses": losses, "reference": reference, "logprobs": logprobs,
            "adapters": {n: t for n, t in state.items() if "lora_" in n}, "model": model, "grads": grads}


@pytest.fixture(scope="module")
def oracles(models) -> dict[str, dict]:
    return {name: _oracle(path, lora) for name, (path, lora) in models.items()}


def _mask():
    return torch.cat([s["loss_mask"] for s in sequences(VOCAB)])


def _logit_bound(model_path: str) -> float:
    """The largest |logit| the model can give whatever its adapters (LoRA adapts neither the final norm nor the
    head): the final RMSNorm's output has L2 norm at most sqrt(hidden) * max|g|, so |z_j| <= ||w_j|| sqrt(hidden)
    max|g| for each head row w_j (Cauchy-Schwarz)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    head, gain = model.get_output_embeddings().weight.detach(), model.model.norm.weight.detach()
    return float(head.norm(dim=1).max() * gain.abs().max() * head.shape[1] ** 0.5)


def _loss_gaps(model_path: str, lora: dict) -> float:
    """Each step's loss -sum_t A_t clip(r_t) / N over the loss tokens, r_t = exp(logprob - old logprob) from two
    forwards of one side's own weights: on each side log r_t lies within the forward's `tolerances.logprob_gap`
    d of 0 (this model's reductions with the adapters' two, relative to `_logit_bound`, which holds at any adapter
    weights), so the two sides' log-ratios differ by at most 2d, far inside the clip range:
    `loss_gaps.policy_loss_gaps` of that, with its own N-term sum."""
    config = AutoConfig.from_pretrained(model_path)
    seqs = sequences(VOCAB)
    reductions = step_reductions(config, seqs, backward=False) + [lora["rank"]] * 2 * config.num_hidden_layers
    d = tolerances.network_rtol(reductions, torch.float32) * _logit_bound(model_path)
    mask = _mask().double()
    weights = mask / mask.sum()
    advantages = torch.cat([s["advantages"] for s in seqs])
    zero = torch.zeros_like(weights)
    gaps, _ = loss_gaps.policy_loss_gaps(zero, zero, None, advantages, dict(loss=weights, metric=weights,
                                          token=weights), torch.full_like(weights, 2 * d), 0.0, None, SETTINGS)
    return gaps["loss"]


def _merge_gaps(model_path: str, lora: dict, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-element bound of two merges W + s B A of the same adapters (s = alpha / rank): each merged element is a
    sum of W and the rank's s * b_k a_k, a product and the scaling each rounding once: a reordered sum of rank + 3
    roundings (`tolerances.reordered_sum_gap`) of |W| + s |B| |A|. A weight no adapter touches is copied: 0."""
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    scale = lora["alpha"] / lora["rank"]
    own = {name.removeprefix("base_model.model."): t for name, t in adapters.items()}
    gaps = {}
    for name, value in base.items():
        stem = name.removesuffix(".weight")
        a, b = own.get(f"{stem}.lora_A.weight"), own.get(f"{stem}.lora_B.weight")
        if a is None:
            gaps[name] = torch.zeros_like(value, dtype=torch.float64)
            continue
        terms = value.double().abs() + scale * (b.double().abs() @ a.double().abs())
        gaps[name] = tolerances.reordered_sum_gap(lora["rank"] + 3, terms, torch.float32)
    return gaps


@pytest.mark.parametrize("layout", LAYOUTS)
def test_three_steps_match_peft(runs, oracles, models, layout):
    run, oracle = runs[layout], oracles[LAYOUTS[layout][0]]
    initial = _own_names(run["initial"])
    assert initial.keys() == oracle["initial"].keys()
    for name, value in oracle["initial"].items():
        assert torch.equal(initial[name], value), f"{name}: megatron's adapters do not start as PEFT's"
    model_path, lora = models[LAYOUTS[layout][0]]
    tolerances.assert_within(torch.tensor(run["losses"]), torch.tensor(oracle["losses"]), _loss_gaps(model_path, lora),
                             "losses")
    adapters = _own_names(run["adapters"])
    config = AutoConfig.from_pretrained(model_path)
    rtol = tolerances.network_rtol(step_reductions(config, sequences(VOCAB)) + [lora["rank"]] * 2
                                   * config.num_hidden_layers, torch.float32)
    for name, value in oracle["adapters"].items():
        # Each gradient element is within rtol * (its tensor's largest |g|) of the oracle's (this model's reductions,
        # the adapters' two included; layouts split the same sums over ranks); Adam turns that into a per-element
        # weight gap (`tolerances.adam_gap`: ~lr * r/|g| where |g| >> r, up to ~2 lr per step where a gradient sits
        # in its rounding noise). Each run also rounds the weight once per step. A weight gap feeding the next
        # step's gradients enters through the next steps' r only to second order.
        grads = oracle["grads"][name]
        bound = tolerances.adam_gap(grads, [rtol * g.abs().max() for g in grads], LR)
        bound += 2 * STEPS * tolerances.unit_roundoff(torch.float32) * value.abs().double()
        tolerances.assert_within(adapters[name], value, bound, msg=name)
    assert all(not torch.equal(adapters[n], v) for n, v in initial.items() if "lora_B" in n), "every B trained"
    # The logprobs after three steps: the two sides' adapters differ (within the bound above), and their effect on
    # the logprobs, to every order, is the difference of PEFT's float64 logprobs at megatron's adapters and at the
    # oracle's; each side's float32 forward adds its rounding (`tolerances.network_rtol` of the forward's reductions,
    # the adapters' two included, relative to `_logit_bound`, which holds at any adapter weights), each float64
    # evaluation its own. Megatron's logprobs are also within that rounding of the float64 ones at its own adapters.
    mask = _mask()
    exact = _float64_logprobs(model_path, lora, adapters)
    exact_oracle = _float64_logprobs(model_path, lora, oracle["adapters"])
    reductions = (step_reductions(config, sequences(VOCAB), backward=False)
                  + [lora["rank"]] * 2 * config.num_hidden_layers)
    rounding = _logit_bound(model_path) * sum(tolerances.network_rtol(reductions, dtype)
                                              for dtype in (torch.float32, torch.float64))
    tolerances.assert_within(run["logprobs"][mask], exact[mask], rounding, "logprobs vs float64 at megatron's adapters")
    tolerances.assert_within(run["logprobs"][mask], oracle["logprobs"][mask],
                             (exact - exact_oracle).abs()[mask] + rounding, "logprobs after three steps")


def _float64_logprobs(model_path: str, lora: dict, adapters: dict[str, torch.Tensor]) -> torch.Tensor:
    """[N] logprobs of transformers + PEFT in float64 with the given adapters (the adapted model's names) over every
    sequence: the exact values to float64's rounding. The log-softmax runs in float64 too (the kernels' is float32)."""
    # Mixtral's experts through their eager loop: the grouped matmul takes no float64
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64, experts_implementation="eager")
    add_lora(model, lora, model_path)
    missing, unexpected = model.load_state_dict({n: t.double() for n, t in adapters.items()}, strict=False)
    assert not unexpected and not [n for n in missing if "lora_" in n], (unexpected, missing)
    batch = pack_sequences(sequences(VOCAB))
    with torch.no_grad():
        scored = scored_logits(model.eval(), batch)
    targets = batch.input_ids[scored.targets_at]
    logprobs = torch.log_softmax(scored.logits.double(), -1).gather(1, targets[:, None]).squeeze(1)
    return torch.zeros(batch.num_tokens, dtype=torch.float64).index_put((scored.targets_at,), logprobs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_base_untouched_reference_is_base_and_merge_is_pefts(runs, models, layout):
    run, (model_path, lora) = runs[layout], models[LAYOUTS[layout][0]]
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    for name, value in base.items():
        assert torch.equal(run["base"][name], value), f"{name}: the base weights moved"
    with torch.no_grad():
        want, _ = batch_logprobs(AutoModelForCausalLM.from_pretrained(model_path).eval(), pack_sequences(
            sequences(VOCAB)), 1.0, False)
    mask = _mask()
    tolerances.assert_within(run["reference"][mask], want[mask], logprob_gap(model_path, sequences(VOCAB)),
                             "reference logprobs")
    merged = _peft_merge(model_path, lora, run["adapters"], os.path.join(os.path.dirname(run["checkpoint"]), "adapter"))
    gaps = _merge_gaps(model_path, lora, run["adapters"])
    assert merged.keys() == gaps.keys()
    for name, value in merged.items():
        tolerances.assert_within(run["merged"][name], value, gaps[name], f"merged {name}")


def _peft_merge(model_path: str, lora: dict, adapters: dict, directory: str) -> dict[str, torch.Tensor]:
    """The adapters written as a PEFT folder, loaded by PEFT on the base model and merged into it."""
    save_adapter(directory, adapters, lora, model_path)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), directory)
    return model.merge_and_unload().state_dict()


@pytest.mark.parametrize("layout", ["single", "tp2", "pp2-vp2", "dp2", "mixtral-ep2", "tp2-optimizer-offload"])
def test_adapter_checkpoint_resumes_exactly_and_converts(runs, models, layout):
    from rl.backends.megatron.backend import MegatronBackend

    run, (model_path, lora) = runs[layout], models[LAYOUTS[layout][0]]
    assert run["resumed_loss"] == run["losses"][-1]
    for name, value in run["adapters"].items():
        assert torch.equal(run["resumed_adapters"][name], value), name
    files = [os.path.join(root, f) for root, _, names in os.walk(run["checkpoint"]) for f in names]
    assert os.path.join(run["checkpoint"], "adapter_config.json") in files
    for shard in (f for f in files if f.endswith(".pt")):
        saved = torch.load(shard, weights_only=False)["model"]
        assert saved and all(".lora." in name for name in saved), f"{shard} holds more than adapters"
    converted = MegatronBackend.checkpoint_weights(run["checkpoint"], model_path)
    want = _peft_merge(model_path, lora, run["checkpointed"], os.path.join(os.path.dirname(run["checkpoint"]), "saved"))
    assert converted.keys() == want.keys()
    gaps = _merge_gaps(model_path, lora, run["checkpointed"])
    for name, value in want.items():
        tolerances.assert_within(converted[name], value, gaps[name], f"converted {name}")
