"""Run metrics: one JSON object per step in metrics.jsonl, a concise console line, TensorBoard and W&B sinks."""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

CONSOLE_KEYS = ("reward_mean", "val_accuracy", "loss", "kl", "grad_norm", "tokens_per_s", "step_time_s")


class MetricsLogger:
    def __init__(self, run_dir: str, loggers: list[str], project: str, run_name: str | None, config: dict):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tensorboard = self.wandb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if "wandb" in loggers:
            if os.environ.get("WANDB_API_KEY"):
                import wandb

                self.wandb = wandb.init(project=project, name=run_name, config=config, dir=run_dir)
            else:
                log.warning("trainer.logger includes wandb but WANDB_API_KEY is not set: W&B logging is off")

    def truncate_after(self, step: int) -> None:
        """On resume: keep only the rows up to `step` (rewritten atomically); a torn last line (a crash mid-write)
        is dropped."""
        if not os.path.exists(self.path):
            return
        rows = [row for row in read_metrics(self.path, torn_tail_ok=True) if row["step"] <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(tmp, self.path)

    def log(self, metrics: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        step = metrics["step"]
        if self.tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float) and key != "step":
                    self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        shown = "  ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
        print(f"step {step:>4}  {shown}", flush=True)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(path: str, torn_tail_ok: bool = False) -> list[dict]:
    """The rows of a metrics.jsonl; with `torn_tail_ok` an unreadable last line (cut by a crash) is skipped."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if not (torn_tail_ok and number == len(lines)):
                raise ValueError(f"{path} line {number} is not a JSON object; fix or remove it") from None
    return rows
