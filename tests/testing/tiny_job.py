"""A tiny job for tests: the embedded tokenizer, a small random Llama and the synthetic task, written to a dir."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

ENGINE_KV_BYTES = 64 << 20
"""Each vLLM engine's KV cache in the suite: bytes, so an engine gets the same cache on every machine (a fraction of
the host's memory left none on one whose NUMA node is small); the tiny jobs' batches need under 8 MiB of it."""
ENGINE_KV_CACHE = f"generator.kv_cache_memory_bytes={ENGINE_KV_BYTES}"


@dataclass(frozen=True)
class TinyJob:
    model_path: str
    train_data: str
    val_data: str

    def overrides(self, steps: int = 2) -> list[str]:
        """A short run: 4 prompts x 4 samples per step, one mini-batch, validation on 8 prompts."""
        return [
            f"trainer.policy.model.path={self.model_path}",
            f"data.train_data=['{self.train_data}']",
            f"data.val_data=['{self.val_data}']",
            f"trainer.max_steps={steps}",
            "trainer.train_batch_size=4",
            "trainer.policy_mini_batch_size=4",
            "trainer.micro_train_batch_size_per_gpu=2",
            "trainer.micro_forward_batch_size_per_gpu=2",
            "generator.n_samples_per_prompt=4",
            "generator.max_generate_length=12",
            "trainer.policy.optimizer_config.lr=1e-3",
            "trainer.eval_interval=0",
            "trainer.eval_before_train=false",
            "trainer.ckpt_interval=0",
        ]


def make_tiny_job(directory: str, seed: int = 0) -> TinyJob:
    from rl.tasks.embedded import write_untrained_job

    job = write_untrained_job(directory, seed)
    return TinyJob(model_path=str(job.model_path), train_data=str(job.train_data), val_data=str(job.val_data))


def run_train(run_dir: str, overrides: list[str], timeout: int = 600, env_extra: dict | None = None,
              own_ray: bool = False, module: str = "rl.launch.train", check: bool = False
              ) -> subprocess.CompletedProcess:
    """The launcher `module` (`rl.launch.train`, or one with its flags: `rl.launch.sft`, `rl.launch.dpo`) in a
    subprocess on one torch thread per process (`rl.core.subprocess_run`), joining the test process's Ray cluster
    (`ray_cluster.shared_ray_address`). A run with `env_extra` (which the cluster's workers would not see) or
    `own_ray` starts a Ray instance of its own, as a user's run does. `check`: assert that it succeeded, showing the
    end of its stderr otherwise."""
    from rl.core.subprocess_run import run_train as run_launcher

    if not (own_ray or env_extra or any(arg.startswith("--ray_address") for arg in overrides)):
        from tests.testing.ray_cluster import shared_ray_address

        overrides = [*overrides, f"--ray_address={shared_ray_address()}"]
    result = run_launcher(run_dir, overrides, threads=1, timeout=timeout, env_extra=env_extra, module=module)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def wait_for(proc, condition, what: str, timeout: float = 300, poll_s: float = 0.5) -> None:
    """Polls `condition` while the launcher process `proc` lives, failing with `what` if it exits first or `timeout`
    seconds pass."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, what
        time.sleep(poll_s)
