"""The memory planner's prediction against measured memory of training steps on CPU, per strategy and option.

    PYTHONPATH=. python -m bench.plan_memory [--model 0.5b|small] [--variants fsdp2,fsdp2-ckpt,...] [--tokens 512]

Each variant builds the real backend (`rl.backends.registry.build_backend`, fp32, world 1 unless named `-tp2` /
`-pp2`, which run two gloo processes) over a random model of the chosen shape and runs two training steps
(`train_micro_batches` + `optimizer_step`) on one packed micro-batch of `--tokens` tokens (4 sequences, the first
quarter of each a prompt, so 3/4 of the positions are scored). Measured, per rank, each variant in fresh processes
with glibc's mmap threshold fixed at 128 KiB (freed tensors leave the resident set):
- `build`: growth of the resident set while the backend is built (its weights and what its wrapper allocates);
- `step`: growth of the peak resident set (VmHWM, reset once built) over the two steps: gradients, optimizer state,
  gathered copies, activations, logits;
- `params` and `optimizer`: bytes of the parameters' and the optimizer state's tensors, counted.
On a machine with CUDA the backends build on the GPU and the same figures come from torch's CUDA allocator instead:
`build` the growth of `memory_allocated`, `step` the peak (`max_memory_allocated`, reset once built) over what was
allocated once built; variants that need more GPUs than the machine has are skipped, with the reason.
Predicted: `rl.backends.planner` for the same shape, tokens and layout in fp32 without the GPU runtime allowance: the
larger of its `train` and `optimizer` phases, split the same way (what exists once built: weights, DeepSpeed's fp32
master partition, ZeRO-3's gradient partition, megatron's gradient buffers; the rest grows in the step). The table is
in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

from bench.common import format_table, free_port, status_kib

SHAPES = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "small": dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True),
}
LORA = dict(rank=8, alpha=16, dropout=0.0, target_modules=["all-linear"], exclude_modules=None,
            init_method="kaiming", merge_on_export=False)
BUCKET = 20_000_000
# name -> (strategy, world, backend options, ModelSpec extras)
VARIANTS = {
    "fsdp2": ("fsdp2", 1, {}, {}),
    "fsdp2-ckpt": ("fsdp2", 1, {}, {"gradient_checkpointing": True}),
    "fsdp2-fused": ("fsdp2", 1, {}, {"fused_kernels": True}),
    "fsdp2-lora": ("fsdp2", 1, {}, {"lora": LORA}),
    "fsdp": ("fsdp", 1, {}, {}),
    "deepspeed-zero2": ("deepspeed", 1, {"zero_optimization": {"stage": 2, "reduce_bucket_size": BUCKET}}, {}),
    "deepspeed-zero3": ("deepspeed", 1, {"zero_optimization": {"stage": 3, "reduce_bucket_size": BUCKET}}, {}),
    "megatron-tp2": ("megatron", 2, {"tensor_model_parallel_size": 2}, {}),
    "megatron-pp2": ("megatron", 2, {"pipeline_model_parallel_size": 2}, {}),
}


def _batch(tokens: int, vocab: int):
    from rl.core.packing import pack_sequences

    g = torch.Generator().manual_seed(0)
    per, seqs = tokens // 4, []
    for _ in range(4):
        mask = torch.arange(per) >= per // 4
        seqs.append({"input_ids": torch.randint(0, vocab, (per,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(per, generator=g) * mask, "old_logprobs": torch.full((per,), -10.0)})
    return pack_sequences(seqs)


def _anon_kib() -> int:
    """The anonymous part of the resident set (tensors; not the mapped checkpoint file's pages)."""
    return status_kib("RssAnon")


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _optimizer_state(backend) -> int:
    engine = getattr(backend, "engine", None)
    optimizer = engine.optimizer if engine is not None else backend.optimizer
    inner = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed's ZeRO wrapper around torch's AdamW
    chained = getattr(getattr(backend, "optimizer", None), "megatron", None)
    if chained is not None:
        inner = chained
    states = [t for opt in getattr(inner, "chained_optimizers", [inner])
              for s in getattr(opt, "state", {}).values() if isinstance(s, dict)
              for t in s.values() if isinstance(t, torch.Tensor) and t.dim() > 0]
    return _tensor_bytes(states)


def _rank(rank: int, world: int, port: int, args, out: str) -> None:
    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.algorithms import LossSettings

    strategy, _, options, extras = VARIANTS[args.child]
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    info = init_distributed(rank, world, "127.0.0.1", port)
    batch, settings = _batch(args.tokens, SHAPES[args.model]["vocab_size"]), LossSettings(use_kl_loss=False)
    normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(), num_sequences=4)
    from rl.backends.registry import backend_class

    backend_class(strategy)  # its imports are not the model's memory
    before = torch.cuda.memory_allocated() if cuda else _anon_kib() * 1024
    spec = ModelSpec(path=args.path, role="policy", temperature=1.0, lr=1e-5, backend_options=options, bf16=False,
                     flash_attn=False, **extras)
    backend = build_backend(strategy, spec, info)
    if cuda:
        torch.cuda.synchronize()
        built_growth = built = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        built_growth, built = _anon_kib() * 1024, status_kib("VmRSS") * 1024
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    params = _tensor_bytes(backend.model.parameters())
    for _ in range(2):
        backend.train_micro_batches([batch], settings, normalizer)
        backend.optimizer_step()
    peak = torch.cuda.max_memory_allocated() if cuda else status_kib("VmHWM") * 1024
    result = {"build_mib": (built_growth - before) / 2**20, "step_mib": (peak - built) / 2**20,
              "params_mib": params / 2**20, "optimizer_mib": _optimizer_state(backend) / 2**20}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run_child(args) -> dict:
    world = VARIANTS[args.child][1]
    out = os.path.join(args.tmp, args.child)
    if world == 1:
        _rank(0, 1, args.port, args, out)
    else:
        torch.multiprocessing.spawn(_rank, args=(world, args.port, args, out), nprocs=world)
    ranks = []
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            ranks.append(json.load(f))
    return {key: max(r[key] for r in ranks) for key in ranks[0]}


def predicted(name: str, model: str, tokens: int) -> dict:
    """The planner's figures for a variant, in MiB: (built, step) growth and the params / optimizer terms."""
    from rl.backends.planner import Knobs, Layout, PlanInputs, estimate, shape_from_config
    from rl.backends.planner.state import counts, model_state

    strategy, world, options, extras = VARIANTS[name]
    shape = shape_from_config({**SHAPES[model], "model_type": "qwen2"})
    zero = options.get("zero_optimization", {})
    knobs = Knobs(strategy, checkpointing=extras.get("gradient_checkpointing", False),
                  zero_stage=zero.get("stage", 2), reduce_bucket=zero.get("reduce_bucket_size", BUCKET),
                  tp=options.get("tensor_model_parallel_size", 1), pp=options.get("pipeline_model_parallel_size", 1))
    lora = extras.get("lora", {}).get("rank", 0)
    inputs = PlanInputs(shape=shape, world=world, gpus_per_node=world, compute_bytes=4, train_tokens=tokens,
                        forward_tokens=tokens, scored_fraction=0.75, lora_rank=lora, fused=extras.get("fused_kernels",
                                                                                                     False),
                        attention="math" if strategy == "megatron" else "sdpa_varlen", runtime_bytes=0.0,
                        mini_batch_sequences=4, micro_batch_sequences=4)  # one micro-batch of 4 sequences a step
    result = estimate(inputs, Layout(strategy), knobs)
    state = model_state(inputs, knobs, shape, counts(shape, lora, inputs.lora_targets))
    built = state.params + (state.grads if state.persistent_grads else 0.0)
    if strategy == "deepspeed":  # the fp32 master partition; ZeRO-3 also allocates its gradient partition up front
        built += 4 * counts(shape, lora, inputs.lora_targets).trainable / world + (
            state.grads if knobs.zero_stage == 3 else 0.0)
    mib = 2 ** 20
    peak = max(result.phases["train"], result.phases["optimizer"])
    return {"build_mib": built / mib, "step_mib": (peak - built) / mib,
            "params_mib": result.terms["params"] / mib, "optimizer_mib": result.terms["optimizer"] / mib,
            "peak_mib": peak / mib}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    from bench.common import memory_child

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        path = os.path.join(tmp, "model")
        Qwen2ForCausalLM(Qwen2Config(**SHAPES[args.model], max_position_embeddings=4096)).save_pretrained(path)
        for name in args.variants.split(","):
            world = VARIANTS[name][1]
            if torch.cuda.is_available() and torch.cuda.device_count() < world:
                print(f"{name}: skipped, it needs {world} GPUs and this machine has {torch.cuda.device_count()}",
                      flush=True)
                continue
            cmd = [sys.executable, "-m", "bench.plan_memory", "--child", name, "--path", path, "--tmp", tmp,
                   "--model", args.model, "--tokens", str(args.tokens), "--port", str(free_port())]
            measured, guess = memory_child(cmd, name), predicted(name, args.model, args.tokens)
            total = measured["build_mib"] + measured["step_mib"]
            rows.append([name, guess["params_mib"], measured["params_mib"], guess["optimizer_mib"],
                         measured["optimizer_mib"], guess["build_mib"], measured["build_mib"], guess["step_mib"],
                         measured["step_mib"], guess["peak_mib"], total, guess["peak_mib"] / total - 1])
            print(json.dumps({"variant": name, "measured": measured, "predicted": guess}), flush=True)
    cuda = torch.cuda.is_available()
    where = f"GPU ({torch.cuda.get_device_name()}, CUDA allocator)" if cuda else "CPU (resident set)"
    print(f"{where}: {args.model} shape, fp32, {args.tokens} tokens per micro-batch (3/4 scored), two steps; "
          "MiB per rank (predicted / measured)")
    print(format_table(["variant", "params p", "params m", "optim p", "optim m", "build p", "build m", "step p",
                        "step m", "peak p", "peak m", "peak error"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
