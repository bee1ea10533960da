"""What the SFT and DPO drivers share (`sft_loop`, `dpo_loop`): the training workers and their models, seeded
batches by step, one optimizer step per batch on the workers, checkpoints, resume, exports and metrics, exactly as
the RL trainer has them; no generation engines.

A driver subclasses `SupervisedTrainer` with `batch_sequences(indices)` (the sequences of one step), `evaluate()`
and the loss settings; `fit()` is the loop.
"""

from __future__ import annotations

import dataclasses
import os
import time
from types import SimpleNamespace

from rl.backends.base import ModelSpec
from rl.backends.registry import STRATEGIES
from rl.core.config import config_to_dict
from rl.core.data import epoch_order
from rl.trainer.batching import MicroBatching, gather
from rl.trainer.policy_update import update_policy
from rl.trainer.state import checkpoint, write_faults
from rl.trainer.state.metrics import MetricsLogger
from rl.trainer.workers.worker_start import model_specs, start_workers


@dataclasses.dataclass(frozen=True)
class PairedMicroBatching(MicroBatching):
    """Micro-batches of preference pairs: sequences 2k and 2k + 1 (a pair) always land in the same micro-batch,
    in that order, so a micro-batch's loss sees whole pairs (`rl.core.algorithms.dpo_loss`)."""

    def split(self, sequences):
        lengths = [len(sequences[i]["input_ids"]) + len(sequences[i + 1]["input_ids"])
                   for i in range(0, len(sequences), 2)]
        plan = [[[member for pair in members for member in (2 * pair, 2 * pair + 1)] for members in rank_plan]
                for rank_plan in self.plan(lengths)]
        return self.build(sequences, plan)


def step_rows(num_rows: int, batch_size: int, seed: int, step: int) -> tuple[int, list[int]]:
    """(epoch, row positions) of 1-based `step`: seeded shuffles per epoch (`rl.core.data.epoch_order`), the last
    incomplete batch of an epoch dropped; a function of the step alone, so a resumed run draws the same batches."""
    per_epoch = max(num_rows // batch_size, 1)
    epoch, index = divmod(step - 1, per_epoch)
    return epoch, epoch_order(num_rows, seed, epoch)[index * batch_size:(index + 1) * batch_size]


class SupervisedTrainer:
    """The loop of an SFT or DPO run over worker group `started.group` (`worker_start.start_workers`)."""

    kind = "sft"
    settings = None  # the loss settings (`SupervisedLossSettings`)
    record: dict | None = None  # the run's config for the loggers, block included (`run_supervised` sets it)

    def __init__(self, cfg, run_dir: str, model_path: str, num_rows: int, max_length: int, with_ref: bool,
                 paired: bool = False):
        """The run's settings only: the data is read and checked by the driver before Ray starts, the workers
        come up in `start`."""
        self.cfg, self.run_dir, self.model_path, self.num_rows = cfg, run_dir, model_path, num_rows
        self.max_length, self.with_ref, self.paired = max_length, with_ref, paired
        self.ckpt_root = checkpoint.root_of(cfg, run_dir)
        self.group = self.ref_group = None
        self.current_step = 0

    def start(self) -> None:
        """The worker actors and their models (the policy; the frozen reference when the loss needs one)."""
        cfg, trainer = self.cfg, self.cfg.trainer
        started = start_workers(cfg)
        self.group, self.ref_group = started.group, started.ref_group
        policy, ref = supervised_specs(cfg, self.model_path, self.with_ref, self.total_steps)
        backend = STRATEGIES.get(trainer.strategy).backend
        self.group.setup(backend, policy, ref if self.ref_group is None else None)
        if self.ref_group is not None and ref is not None:
            self.ref_group.setup(backend, None, ref)
        for group in (self.group, self.ref_group):
            if group is not None:
                group.timeout_s = trainer.actor_call_timeout_s
        size = trainer.micro_train_batch_size_per_gpu
        budget = trainer.max_tokens_per_micro_batch or size * self.max_length * (2 if self.paired else 1)
        kind = PairedMicroBatching if self.paired else MicroBatching
        self.batching = kind(packed=trainer.use_sample_packing, max_tokens=budget, micro_batch_size=size,
                             dp_size=self.group.dp_size, pad_token_id=0)
        self.ref_batching = (dataclasses.replace(self.batching, dp_size=self.ref_group.dp_size)
                             if self.ref_group is not None else None)
        self.metrics = MetricsLogger(self.run_dir, list(trainer.logger), trainer.project_name, trainer.run_name,
                                     self.record or config_to_dict(cfg))

    # --- what a driver supplies ---------------------------------------------------------------------------
    def batch_sequences(self, rows: list[int]) -> list[dict]:
        raise NotImplementedError

    def prepare_step(self, sequences: list[dict]) -> None:
        """Adds what the loss needs beyond tokens and mask (DPO: the reference logprobs)."""

    def evaluate(self, step: int) -> dict[str, float]:
        return {}

    # --- the loop -----------------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        trainer = self.cfg.trainer
        return trainer.max_steps or trainer.epochs * max(self.num_rows // trainer.train_batch_size, 1)

    def fit(self) -> None:
        trainer = self.cfg.trainer
        start = self.resume()
        if start == 0 and trainer.eval_before_train:
            row = self.evaluate(0)
            if row:
                self.metrics.log({"step": 0, **row})
        for step in range(start + 1, self.total_steps + 1):
            self.current_step = step
            row = self.train_step(step)
            if _due(step, trainer.eval_interval, self.total_steps):
                row.update(self.evaluate(step))
            self.metrics.log(row)
            if _due(step, trainer.ckpt_interval):
                self.save_checkpoint(step)
            if _due(step, trainer.hf_save_interval):
                self.export(step)
        self.metrics.close()

    def train_step(self, step: int) -> dict[str, float]:
        began = time.perf_counter()
        epoch, rows = step_rows(self.num_rows, self.cfg.trainer.train_batch_size, self.cfg.trainer.seed, step)
        sequences = self.batch_sequences(rows)
        self.prepare_step(sequences)
        out = update_policy(self.group, self.batching, self.settings, SimpleNamespace(sequences=sequences),
                            len(sequences))
        seconds = time.perf_counter() - began
        tokens = sum(len(s["input_ids"]) for s in sequences)
        return {"step": step, "epoch": epoch, **out, "tokens": tokens, "tokens_per_s": tokens / seconds,
                "step_time_s": seconds}

    def logprobs(self, sequences: list[dict], model: str = "policy") -> list:
        """Per-token logprobs of `sequences` under the policy or the reference (its own group where it has one)."""
        group, batching = ((self.ref_group, self.ref_batching) if model == "ref" and self.ref_group is not None
                           else (self.group, self.batching))
        shards = batching.split(sequences)
        return gather(shards, group.call_sharded("logprobs", shards, model), len(sequences))

    def save_checkpoint(self, step: int) -> None:
        staging = checkpoint.staging_dir(self.ckpt_root, step)
        with write_faults.one_line(f"the checkpoint of step {step}", checkpoint.step_dir(self.ckpt_root, step), staging,
                                   "trainer.ckpt_path"):
            self.group.call("save_checkpoint", staging)
            state = {"step": step, "kind": self.kind, "strategy": self.cfg.trainer.strategy,
                     "model_path": os.path.abspath(self.model_path) if os.path.isdir(self.model_path)
                     else self.model_path}
            checkpoint.commit(self.ckpt_root, step, state)
        checkpoint.apply_retention(self.cfg.trainer, self.ckpt_root, self.metrics.path)

    def resume(self) -> int:
        mode = self.cfg.trainer.resume_mode
        if mode in (None, "none"):
            return 0
        path = checkpoint.latest(self.ckpt_root) if mode == "latest" else mode
        if path is None:
            self.metrics.truncate_after(-1)
            return 0
        if not checkpoint.is_complete(path):
            raise ValueError(f"trainer.resume_mode: {path} is not a complete checkpoint (no {checkpoint.MARKER})")
        damaged = checkpoint.verify(path)
        if damaged:
            raise ValueError(f"trainer.resume_mode: {path} is damaged: {'; '.join(damaged)}")
        mismatch = checkpoint.strategy_mismatch(path, self.cfg.trainer.strategy)
        if mismatch:
            raise ValueError(f"trainer.resume_mode: {mismatch}")
        state = checkpoint.read_trainer_state(path)
        if state.get("kind", self.kind) != self.kind:
            raise ValueError(f"trainer.resume_mode: {path} is a {state['kind']} checkpoint and this is a {self.kind} "
                             "run; start the run from its export with trainer.policy.model.path instead")
        self.group.call("load_checkpoint", path)
        self.metrics.truncate_after(state["step"])
        print(f"resumed from {path} (step {state['step']})", flush=True)
        return int(state["step"])

    def export(self, step: int) -> str:
        root = self.cfg.trainer.export_path or os.path.join(self.run_dir, "exports")
        path = os.path.join(root, f"global_step_{step}")
        with write_faults.one_line(f"the export of step {step}", path, path + ".partial", "trainer.export_path"):
            os.makedirs(root, exist_ok=True)
            self.group.call("export_hf", self.model_path, path)
        return path

    def full_state_dict(self) -> dict:
        return self.group.call("full_state_dict")[0]

    def close(self) -> None:
        pass


def supervised_specs(cfg, model_path: str, with_ref: bool, steps: int = 0) -> tuple[ModelSpec, ModelSpec | None]:
    """The policy's spec as the RL run builds it, at temperature 1 and on the unfused loss path (the supervised
    losses take token logprobs); with `with_ref` the frozen reference (the starting weights; a LoRA policy is its
    own reference, adapters off, so none). `steps`: the run's steps, one optimizer step each."""
    policy, _ = model_specs(cfg, model_path, optimizer_steps=steps)
    policy = dataclasses.replace(policy, temperature=1.0, fused_kernels=False)
    if not with_ref or policy.lora:
        return policy, None
    options = STRATEGIES.get(cfg.trainer.strategy).backend_options(cfg, "ref")
    return policy, dataclasses.replace(policy, role="ref", backend_options=options, lora=None)


def _due(step: int, interval: int, last: int | None = None) -> bool:
    return bool(interval) and (step % interval == 0 or step == last)


def run_supervised(cfg, section: str, block, make_trainer, run_dir: str | None = None,
                   ray_address: str | None = None) -> str:
    """Runs a supervised trainer (`make_trainer(cfg, run_dir)`) with Ray around it; returns the run directory.
    Nothing is created before the preflight passes (`supervised_preflight`, a ConfigError naming every problem);
    the run directory's config.yaml holds the `section` block beside the rest."""
    import torch

    from rl.core.config.supervised import save_supervised_config, supervised_config_dict
    from rl.trainer.run import default_run_dir, prepare_run_dir
    from rl.trainer.supervised.preflight import supervised_preflight
    from rl.trainer.workers.placement import machine_cores, make_plan
    from rl.trainer.workers.worker_group import start_ray, stop_ray

    supervised_preflight(cfg, section, block, ray_address)
    run_dir = prepare_run_dir(run_dir or default_run_dir(), cfg.trainer.resume_mode)
    save_supervised_config(cfg, section, block, os.path.join(run_dir, "config.yaml"))
    print(f"run directory: {run_dir}", flush=True)
    trainer = make_trainer(cfg, run_dir)  # data read and checked before Ray starts
    trainer.record = supervised_config_dict(cfg, section, block)
    start_ray(run_dir, ray_address, slots=make_plan(cfg, torch.cuda.is_available(), machine_cores()).slots)
    try:
        trainer.start()
        trainer.fit()
    except KeyboardInterrupt:
        from rl.trainer.run import Interrupted

        latest = checkpoint.latest(trainer.ckpt_root, log=lambda _: None)
        raise Interrupted(trainer.current_step, latest) from None
    finally:
        trainer.close()
        stop_ray()
    return run_dir
