"""`bazel run //rl/launch:plan -- [--strategy=S|auto] [--config=FILE.yaml] [key=value ...]`

Prints the memory planner's prediction for the configured model and GPUs before anything starts: one row per
candidate layout (fsdp2 and fsdp with checkpointing / offload / resharding / HSDP, deepspeed ZeRO 1-3 with offload,
megatron TP x PP x EP x CP with recompute), each with the per-GPU GiB of parameters, gradients, optimizer state,
gathered units, activations at the micro-batch's tokens, logits (or the fused loss's chunk), the reference model,
the critic, the colocated engine and the runtime allowance; the peak and its phase; whether it fits; why a row is
excluded. The configured layout is marked `*`. `--strategy=S` sets trainer.strategy=S (as the training launcher's
flag does) and shows S's layouts only; `--strategy=auto` runs `trainer.strategy=auto` and says what it chose. GPU
memory: `trainer.placement.gpu_memory_gb`, else this machine's first GPU. The formulas and their sources:
rl/backends/planner/terms.py.
"""

from __future__ import annotations

import sys

from absl import flags

from rl.backends.planner import AUTO, STRATEGY_ORDER, configured, plan, render
from rl.backends.planner.terms import GIB
from rl.backends.registry import STRATEGIES
from rl.core.config import ConfigError, load_config
from rl.launch import cli
from rl.trainer.preflight.memory_plan import gpu_memory, plan_inputs, resolve_auto

PLAN_FLAGS = flags.FlagValues()  # its own flags: the training launcher defines the same names
flags.DEFINE_string("strategy", None, f"Show one strategy's layouts ({', '.join(STRATEGIES.names())}), or auto: "
                    "also choose as trainer.strategy=auto does. Default: every strategy.", flag_values=PLAN_FLAGS)
flags.DEFINE_string("config", None, "YAML file layered over the defaults, before key=value overrides.",
                    flag_values=PLAN_FLAGS)


def describe(inputs, cfg, source: str) -> str:
    s = inputs.shape
    kind = f", MoE {s.experts} experts (top {s.experts_per_token})" if s.is_moe else ""
    gpu = f"{inputs.gpu_bytes / GIB:.1f} GiB ({source})" if inputs.gpu_bytes is not None else f"unknown ({source})"
    return "\n".join([
        f"model: {cfg.trainer.policy.model.path} ({s.model_type or 'decoder'}): {s.total_params() / 1e9:.3f}B "
        f"parameters; hidden {s.hidden}, {s.layers} layers, {s.heads} heads / {s.kv_heads} key-value heads, "
        f"MLP {s.intermediate}, vocabulary {s.vocab}{', tied embeddings' if s.tied else ''}{kind}",
        f"GPUs: {inputs.world} ({inputs.gpus_per_node} per node) of {gpu}; "
        f"{'bf16' if inputs.compute_bytes == 2 else 'fp32'} compute; micro-batch {inputs.train_tokens} tokens "
        f"(forward {inputs.forward_tokens}); attention {inputs.attention}"
        + (f"; LoRA rank {inputs.lora_rank}" if inputs.lora_rank else "")
        + ("; fused loss" if inputs.fused else "")
        + ("; reference model on these GPUs" if inputs.ref_shape is not None else "")
        + ("; critic" if inputs.critic_shape is not None else "")
        + (f"; colocated {inputs.engine.backend} engine" if inputs.engine is not None else ""),
    ])


def main(argv: list[str]) -> int:
    if any(arg in cli.HELP for arg in argv[1:]):
        print(__doc__)
        print(PLAN_FLAGS.module_help(__name__) if hasattr(PLAN_FLAGS, "module_help") else PLAN_FLAGS)
        print("\n" + cli.OVERRIDES_HELP)
        return 0
    if cli.override_as_flag(argv):
        return 2
    try:
        overrides = PLAN_FLAGS(argv)[1:]
    except flags.Error as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    strategy = PLAN_FLAGS.strategy
    try:
        cfg = load_config(overrides, config_file=PLAN_FLAGS.config, strategy=strategy, auto=resolve_auto)
    except ConfigError as error:
        return cli.refused(error)
    gpu, source = gpu_memory(cfg)
    inputs = plan_inputs(cfg, gpu)
    if inputs is None:
        print(f"trainer.policy.model.path: cannot read the config.json of {cfg.trainer.policy.model.path} here (a "
              "local directory, a hub name in the local cache, or embedded)", file=sys.stderr)
        return 2
    print(describe(inputs, cfg, source))
    if cfg.trainer.auto_choice:
        print(f"trainer.strategy=auto chose {cfg.trainer.auto_choice}")
    current = configured(cfg, inputs)
    shown = (strategy,) if strategy not in (None, AUTO) else STRATEGY_ORDER
    rows = [current] + [e for _, e in plan(cfg, inputs, shown) if e.knobs != current.knobs]
    print(render(rows, inputs.gpu_bytes, mark=current))
    print("GiB per GPU; * = the configured layout; phases: train, critic, logprobs (forward-only passes), generate "
          "(colocated engine). Formulas and sources: rl/backends/planner/terms.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
