"""Runs one training step of a strategy in `world` gloo processes and returns what rank 0 saw.

Every data-parallel shard gets its own sequences (as the driver's split does). The result holds the loss and
metrics summed over shards, per-token logprobs of every sequence, full gradients in Hugging Face naming and the
global grad norm, so runs of different strategies and layouts can be compared tensor by tensor.
"""

from __future__ import annotations

import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import pack_sequences
from tests.testing import tolerances
from tests.testing.rendezvous import join, rendezvous

LENGTHS = ((6, 9, 4, 7), (5, 8, 3, 10))  # sequences given to rank 0 and rank 1 in 2-rank runs
VOCAB = 61  # odd: TP=2 pads the vocabulary to 62 and must mask the extra column
STEP_SETTINGS = LossSettings(use_kl_loss=False, entropy_loss_coef=0.01, use_entropy_loss=True)  # `_one_step`'s


def sequences(vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (n for rank in LENGTHS for n in rank):
        mask = torch.arange(n) >= 2
        ids = torch.randint(1, vocab, (n,), generator=g)
        ids[1] = 0  # the pad token of the test models: HF gives its embedding row no gradient from lookups
        out.append({"input_ids": ids, "loss_mask": mask,
                    "advantages": torch.randn(n, generator=g) * mask,
                    "old_logprobs": -torch.rand(n, generator=g) * mask})
    return out


def save_model(model, path) -> str:
    model.save_pretrained(path)
    return str(path)


def qwen_model(directory, hidden: int, layers: int) -> str:
    """A random tied-embedding Qwen2 of the vocabulary the sequences use, saved to `directory`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 3 // 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, pad_token_id=0, max_position_embeddings=64)
    return save_model(Qwen2ForCausalLM(config), directory)


def model_logits(model_path: str, seqs: list[dict], temperature: float = 1.0) -> torch.Tensor:
    """Each sequence alone through transformers, divided by the temperature: the logits every strategy's logprobs
    and entropy come from, whose magnitude scales their rounding (`tolerances.logprob_gap`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=s["input_ids"][None]).logits[0] for s in seqs]) / temperature


def step_reductions(config, seqs: list[dict], backward: bool = True) -> list[int]:
    """The reductions of one training step (`tolerances.decoder_reductions`) over `seqs`: the weight gradients sum
    over every token of the step (`backward`), attention over the longest sequence; a mixture of experts adds its
    router's softmax over the experts and the sum of the chosen experts' outputs per layer. Tensor, pipeline,
    context, sequence and data parallelism split these same sums over ranks: they reorder them, which the bound
    covers."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    reductions = tolerances.decoder_reductions(config, max(len(s["input_ids"]) for s in seqs),
                                               sum(len(s["input_ids"]) for s in seqs) if backward else 0)
    if get("num_local_experts"):
        reductions += [get("num_local_experts"), get("num_experts_per_tok")] * get("num_hidden_layers")
    return reductions


def logprob_gap(model_path: str, seqs: list[dict], temperature: float = 1.0) -> float:
    """`tolerances.logprob_gap` of the model at `model_path` on `seqs`: the forward's reductions relative to the
    largest logit."""
    config = AutoConfig.from_pretrained(model_path)
    rtol = tolerances.network_rtol(step_reductions(config, seqs, backward=False), torch.float32)
    return rtol * float(model_logits(model_path, seqs, temperature).abs().max())


def assert_same_step(got: dict, want: dict, model_path: str, seqs: list[dict] | None = None,
                     temperature: float = 1.0, settings: LossSettings = STEP_SETTINGS) -> None:
    """Two `run_step` results of the model at `model_path` on `seqs` (the harness's by default) agree: metrics, grad
    norm, logprobs and entropy of loss tokens, every gradient, each within the rounding of float32 computations of
    the same sums in other orders (`tests.testing.tolerances`):
    - logprobs: `logprob_gap` d; entropy H = -sum p log p moves by at most H * d when every
      log-probability moves by at most d (dH = -sum p (d log p) log p), d itself when H < 1 (its own vocabulary sum);
    - metrics, token means over the N loss tokens: pg_loss's terms -A * clip(r) with r = exp(logp - old) move by at
      most |A| r e^d d, ppo_kl's by d, entropy's by H * d; each mean's own N-term sum adds 2 gamma_N of its terms'
      magnitude; `loss` is pg_loss - coef * entropy; pg_clipfrac may count differently only the tokens whose ratio
      lies within e^(+-d) of a clip edge, plus 2 gamma_N of it for its float32 shares' sum;
    - gradients: `gradient_gap` of the step's reductions (`step_reductions`);
    - grad norm: the gradients' gaps in the L2 norm, plus gamma_n of the norm for its own n-term sum of squares
      (two orders differ by 2 gamma_n relative, which the square root halves).
    """
    seqs = seqs if seqs is not None else sequences(VOCAB)
    config = AutoConfig.from_pretrained(model_path)
    mask = torch.cat([s["loss_mask"] for s in seqs])
    d = logprob_gap(model_path, seqs, temperature)
    entropy = want["entropy"][mask].double()
    tolerances.assert_within(got["logprobs"][mask], want["logprobs"][mask], d, "logprobs")
    tolerances.assert_within(got["entropy"][mask], want["entropy"][mask], d * entropy.clamp(min=1), "entropy")

    n = int(mask.sum())
    two_gamma = 2 * tolerances.gamma(n, torch.float32)
    logprob = want["logprobs"][mask].double()
    old = torch.cat([s["old_logprobs"] for s in seqs])[mask].double()
    advantages = torch.cat([s["advantages"] for s in seqs])[mask].double().abs()
    ratio = torch.exp(logprob - old + d)  # the largest ratio either run can have
    edges = torch.tensor([1 - settings.eps_clip_low, 1 + settings.eps_clip_high], dtype=torch.float64)
    low, high = torch.exp(logprob - old - d), ratio
    near_edge = ((low[:, None] <= edges) & (edges <= high[:, None])).any(dim=1)
    magnitude = torch.maximum(ratio, edges[1])  # |clip(r)| <= max(r, 1 + eps_high)
    bounds = {
        "pg_loss": float((advantages * ratio * d + two_gamma * advantages * magnitude).sum()) / n,
        "entropy": float((entropy.clamp(min=1) * d + two_gamma * entropy).sum()) / n,
        "ppo_kl": float((d + two_gamma * (logprob - old).abs()).sum()) / n,
        # each share of the count is divided by N and rounded, the shares then summed in any order
        "pg_clipfrac": float(near_edge.sum()) / n + two_gamma * abs(want["metrics"].get("pg_clipfrac", 0.0)),
    }
    bounds["loss"] = bounds["pg_loss"] + settings.entropy_loss_coef * bounds["entropy"]
    assert got["metrics"].keys() == want["metrics"].keys()
    for name, value in want["metrics"].items():
        tolerances.assert_within(torch.tensor(got["metrics"][name]), torch.tensor(value), bounds[name], name)

    reductions = step_reductions(config, seqs)
    gaps = {name: tolerances.gradient_gap(grad, reductions) for name, grad in want["grads"].items()}
    for name, grad in want["grads"].items():
        tolerances.assert_within(got["grads"][name], grad, gaps[name], name)
    numel = sum(grad.numel() for grad in want["grads"].values())
    norm_gap = (math.sqrt(sum(want["grads"][name].numel() * gap**2 for name, gap in gaps.items()))
                + tolerances.gamma(numel, torch.float32) * want["grad_norm"])
    tolerances.assert_within(torch.tensor(got["grad_norm"]), torch.tensor(want["grad_norm"]), norm_gap, "grad_norm")


def shard_batches(vocab: int, dp_size: int, micro_batches: int = 1):
    """The sequences split into `dp_size` contiguous shards, each cut into `micro_batches` packed micro-batches."""
    seqs = sequences(vocab)
    per_shard = len(seqs) // dp_size
    shards = []
    for shard in range(dp_size):
        mine = seqs[shard * per_shard:(shard + 1) * per_shard]
        per_micro = -(-len(mine) // micro_batches)
        shards.append([pack_sequences(mine[m * per_micro:(m + 1) * per_micro]) for m in range(micro_batches)])
    return shards, seqs


def reported(value, layout):
    """Every rank's (layout, value), gathered; the reporting ranks' values in shard order."""
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (layout, value))
    return [v for lay, v in sorted((e for e in everyone if e[0].reports), key=lambda e: e[0].index)]


def _gather_grad_buffers(ddp) -> None:
    """After megatron's reduce-scatter each DP rank holds the reduced grads of its own slice of every bucket (the
    distributed optimizer's shard): all-gather the slices so `param.main_grad` is the whole reduced gradient."""
    for buffer in ddp.buffers + ddp.expert_parallel_buffers:
        group = buffer.data_parallel_group
        for bucket in buffer.buckets:
            mine = bucket.grad_data.chunk(dist.get_world_size(group))[dist.get_rank(group)].clone()
            dist.all_gather_into_tensor(bucket.grad_data, mine, group=group)


def _full_grads(backend, strategy: str) -> dict[str, torch.Tensor]:
    if strategy == "megatron":
        from rl.backends.megatron.checkpoint import gather_shards
        from rl.backends.megatron.convert import megatron_to_hf

        for chunk in backend.ddp:
            _gather_grad_buffers(chunk)
        grads = [{name: p.main_grad for name, p in chunk.named_parameters()} for chunk in backend.chunks]
        layout = backend.layout
        shards = gather_shards(grads, layout)
        return megatron_to_hf(shards, backend.hf_config, layout.tp, layout.pp * layout.vp, layout.ep) if shards else {}
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for name, p in backend.model.named_parameters()}


def _one_step(info, strategy: str, options: dict, model_path: str, vocab: int) -> dict:
    """One step as the driver runs it: each data-parallel shard's sequences go to the ranks of that shard (as
    `micro_batches` micro-batches: `options["micro_batches"]`, default 1), results come from the reporting ranks."""
    from rl.backends.base import ModelSpec
    from rl.backends.registry import build_backend

    torch.manual_seed(0)
    options = dict(options)  # `gradient_checkpointing`, `use_fused_kernels`: trainer keys, not megatron_config ones
    micro_batches = options.pop("micro_batches", 1)
    spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=1e-2, max_grad_norm=1e9,
                     gradient_checkpointing=options.pop("gradient_checkpointing", False),
                     fused_kernels=options.pop("use_fused_kernels", False), backend_options=options)
    backend = build_backend(strategy, spec, info)
    recompute = getattr(getattr(backend.model, "config", None), "recompute_granularity", None)
    layout = backend.data_parallel_rank()
    shards, seqs = shard_batches(vocab, layout.size, micro_batches)
    mine = shards[layout.index]
    logprobs = [backend.logprobs(batch, with_entropy=True) for batch in mine]
    settings = STEP_SETTINGS
    tokens = sum(int(s["loss_mask"].sum()) for s in seqs)
    normalizer = LossNormalizer.from_counts("token_mean", tokens, len(seqs), dp_world_size=layout.size)
    metrics = backend.train_micro_batches(mine, settings, normalizer)
    summed: dict[str, float] = {}
    for shard_metrics in reported(metrics, layout):
        for name, value in shard_metrics.items():
            summed[name] = summed.get(name, 0.0) + value
    norm = backend.clip_grad_norm()
    grads = _full_grads(backend, strategy)
    shard_logprobs = reported(logprobs, layout)
    if strategy == "megatron":  # the next layout builds its own parallel state
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    return {"metrics": summed, "logprobs": torch.cat([lp for shard in shard_logprobs for lp, _ in shard]),
            "entropy": torch.cat([ent for shard in shard_logprobs for _, ent in shard]), "grads": grads,
            "grad_norm": norm, "recompute_granularity": recompute, "dp_size": layout.size}


def _worker(rank: int, world: int, port: int, strategy: str, layouts: list[dict], model_path: str, vocab: int,
            out: str) -> None:
    torch.set_num_threads(1)
    info = join(rank, world, port)
    results = [_one_step(info, strategy, options, model_path, vocab) for options in layouts]
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def run_steps(strategy: str, model_path: str, vocab: int, world: int, layouts: list[dict]) -> list[dict]:
    """One step per layout (megatron_config options), all in one group of `world` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        with rendezvous(world) as port:
            mp.spawn(_worker, args=(world, port, strategy, layouts, model_path, vocab, out), nprocs=world)
        return torch.load(out, weights_only=False)


def run_step(strategy: str, model_path: str, vocab: int, world: int = 2, options: dict | None = None) -> dict:
    return run_steps(strategy, model_path, vocab, world, [options or {}])[0]


def _train_once(backend, batch) -> dict[str, float]:
    """One step with `batch` on every data-parallel shard; the metrics of shard 0's reporting rank."""
    layout = backend.data_parallel_rank()
    settings = LossSettings(use_kl_loss=False)
    tokens = int(batch.loss_mask.sum()) * layout.size
    normalizer = LossNormalizer.from_counts("token_mean", tokens, batch.num_sequences * layout.size,
                                            dp_world_size=layout.size)
    metrics = backend.train_micro_batches([batch], settings, normalizer)
    metrics = reported(metrics, layout)[0]
    metrics.update(backend.optimizer_step())
    return metrics


def _state_round_trip(info, options: dict, model_path: str, vocab: int, directory: str) -> dict:
    from rl.backends.base import ModelSpec
    from rl.backends.hf_model import save_hf_checkpoint
    from rl.backends.registry import build_backend

    torch.manual_seed(0)
    # a cosine decay from 1e-2 reaching 1e-3 at the third optimizer step: the resumed (second) step takes 5.5e-3
    spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=1e-2, scheduler="cosine", lr_decay_steps=2,
                     min_lr=1e-3, backend_options=options)
    batch = pack_sequences(sequences(vocab)[:4])  # the same batch on every rank
    first = build_backend("megatron", spec, info)
    optimizer_numel = sum(p.numel() for opt in first.optimizer.torch_optimizers()
                          for group in opt.param_groups for p in group["params"])
    weights_numel = sum(p.numel() for p in first.model.parameters())
    _train_once(first, batch)
    first.save_checkpoint(os.path.join(directory, "ckpt"))
    saved_logprobs = reported(first.logprobs(batch)[0], first.data_parallel_rank())[0]  # of the saved weights
    expected = _train_once(first, batch)
    expected_state = first.full_state_dict()
    trained_logprobs = reported(first.logprobs(batch)[0], first.data_parallel_rank())[0]
    second = build_backend("megatron", spec, info)
    second.load_checkpoint(os.path.join(directory, "ckpt"))
    got = _train_once(second, batch)
    got_state = second.full_state_dict()
    export = os.path.join(directory, "export")
    if info.rank == 0:
        save_hf_checkpoint(model_path, dict(got_state), export)  # save_pretrained empties the dict it gets
    from megatron.core import parallel_state

    timeouts = {name: _timeout_s(group) for name, group in (
        ("world", dist.group.WORLD), ("megatron data-parallel", parallel_state.get_data_parallel_group()),
        ("a new group", dist.new_group(list(range(info.world_size)))))}
    parallel_state.destroy_model_parallel()
    return {"timeouts": timeouts, "expected": expected, "got": got, "expected_state": expected_state,
            "got_state": got_state,
            "export": export, "trained_logprobs": trained_logprobs, "saved_logprobs": saved_logprobs, "batch": batch,
            "optimizer_numel": optimizer_numel, "weights_numel": weights_numel}


COLLECTIVE_TIMEOUT_S = 1234.0
"""trainer.collective_timeout_s of the state round trips: every group of the run must take it."""


def _timeout_s(group) -> float:
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def _state_worker(rank: int, world: int, port: int, layouts: list[dict], model_path: str, vocab: int,
                  directory: str) -> None:
    """Per layout: train, checkpoint, train on; a fresh backend restored from the checkpoint must repeat the
    second step exactly; rank 0 exports the trained weights for transformers."""
    torch.set_num_threads(1)
    info = join(rank, world, port, timeout_s=COLLECTIVE_TIMEOUT_S)
    results = [_state_round_trip(info, options, model_path, vocab, os.path.join(directory, str(i)))
               for i, options in enumerate(layouts)]
    if rank == 0:
        torch.save(results, os.path.join(directory, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


def run_state_round_trips(model_path: str, vocab: int, layouts: list[dict], directory: str, world: int = 2
                          ) -> list[dict]:
    with rendezvous(world) as port:
        mp.spawn(_state_worker, args=(world, port, layouts, model_path, vocab, directory), nprocs=world)
    return torch.load(os.path.join(directory, "result.pt"), weights_only=False)
