"""A tiny job for tests: the embedded tokenizer, a small random Llama and the synthetic task, written to a dir."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass


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
    from rl.core.embedded import write_untrained_job

    job = write_untrained_job(directory, seed)
    return TinyJob(model_path=str(job.model_path), train_data=str(job.train_data), val_data=str(job.val_data))


def run_train(run_dir: str, overrides: list[str], timeout: int = 600, env_extra: dict | None = None,
              start_new_session: bool = False) -> subprocess.CompletedProcess:
    """`python -m rl.launch.train` in a subprocess (the same interpreter and import path as the test).

    With start_new_session the run gets its own process group, which is killed afterwards: a driver that died
    by SIGKILL cannot stop the Ray processes it started."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), **(env_extra or {})}
    cmd = [sys.executable, "-m", "rl.launch.train", f"--run_dir={run_dir}", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=start_new_session)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if start_new_session:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
