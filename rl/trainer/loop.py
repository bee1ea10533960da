"""The GRPO/PPO training loop: rollouts -> rewards -> logprobs -> advantages -> policy update -> weights to the
generation engine, with validation, checkpoints and Hugging Face exports at their intervals. With
`trainer.fully_async` the rollouts of the next steps are generated while a step trains (`RolloutQueue`)."""

from __future__ import annotations

import os
import time

import torch

from rl.core.algorithms.reward_shaping import overlong_penalty, pass_and_mean_at_k
from rl.core.config import config_to_dict
from rl.core.config.choices import ROLLOUT_ANCHORED_POLICY_LOSSES
from rl.core.data import BatchPosition, batches_per_epoch, iter_batches
from rl.tasks.jobs import resolve_sources
from rl.trainer import components
from rl.trainer.experience import Experience, assign_advantages, build_experience, mask_zero_variance_groups
from rl.trainer.kl_reward import KLInReward
from rl.trainer.multi_turn.episodes import Episodes
from rl.trainer.policy_update import compute_logprobs, is_on_policy, loss_settings, micro_batching, update_policy
from rl.trainer.rewards.reward_models import start_reward_models
from rl.trainer.rewards.rewarding import RewardScorer
from rl.trainer.rollout.engines import RemoteEngines
from rl.trainer.rollout.prompt_encoding import PromptEncoder, refuse_at_start
from rl.trainer.rollout.rollout_queue import EpisodeJobs, RolloutQueue, SingleTurnJobs
from rl.trainer.rollout.sampling import ScoredBatch, collect_step_batch
from rl.trainer.rollout.weight_sync import make_weight_sync
from rl.trainer.rollout_mismatch import anchor_on_rollout, measure_and_correct, skips_old_logprob_pass
from rl.trainer.startup import StartupClock
from rl.trainer.state import checkpoint, finite, write_faults
from rl.trainer.state.faults import crash_point
from rl.trainer.state.metrics import MetricsLogger
from rl.trainer.workers.placement import needs_reference
from rl.trainer.workers.restarts import RestartBudget
from rl.trainer.workers.worker_start import StartedWorkers, setup_worker_groups, start_workers


class Trainer:
    def __init__(self, cfg, run_dir: str, started: StartedWorkers | None = None, clock: StartupClock | None = None,
                 restarts: int = 0, budget: RestartBudget | None = None):
        """`started`: the placement and worker actors already started (`start_workers`), or None to start them
        here; `clock` is charged with the phases of the start; `restarts` (logged where allowed): how many times
        the run's actors started again after a death, `budget` the recoveries it may make (trainer.max_restarts)."""
        self.restarts, self.budget = restarts, budget
        from transformers import AutoTokenizer

        self.cfg, self.run_dir = cfg, run_dir
        clock = clock or StartupClock()
        started = started or start_workers(cfg)
        self.placement, self.group, self.ref_group, self.critic_group = started
        sources = resolve_sources(cfg, run_dir)
        self.model_path = sources.model_path
        clock.mark("sources")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.train_set, self.val_set = components.load_datasets(cfg, sources.train_data, sources.val_data)
        refuse_at_start(cfg, self.tokenizer, {"data.train_data": self.train_set, "data.val_data": self.val_set},
                        self.model_path)
        if cfg.data.val_split_size:
            print(f"data: {len(self.train_set)} training prompts, {len(self.val_set)} validation prompts from "
                  f"{', '.join(self.val_set.files)}", flush=True)
        self.prompts = PromptEncoder(self.tokenizer, cfg.generator.max_prompt_length, cfg.data.truncation,
                                     processor=components.image_processor(self.model_path))
        self.episodes = Episodes.from_config(cfg, self.tokenizer, self.model_path)
        self.kl_in_reward = KLInReward(cfg.trainer.algorithm) if cfg.trainer.algorithm.use_kl_in_reward else None
        # the KL in the reward needs the policy's logprobs before the update: the old-logprob pass always runs
        # exact on-policy: the engine's logprobs are the trainer's, so they are the old ones (`anchor_on_rollout`)
        self.on_policy = cfg.trainer.exact_on_policy or (self.kl_in_reward is None and skips_old_logprob_pass(
            cfg, is_on_policy(cfg.trainer.train_batch_size, cfg.trainer.policy_mini_batch_size,
                              cfg.trainer.update_epochs_per_batch)))
        self.settings, self.value_settings = loss_settings(cfg, self.on_policy)
        clock.mark("data")
        # an environment's step rewards replace data.reward_fn
        self.rewards = None if self.episodes is not None else RewardScorer(
            cfg.data, start_reward_models(cfg, cfg.data.reward_fn, cfg.trainer.actor_call_timeout_s,
                                          self.placement.guest_options()))
        self.engine = components.make_engine(cfg, self.model_path, self.tokenizer, self.placement)
        print(f"generation: {cfg.generator.backend} engine on {self.engine.device}", flush=True)
        clock.mark("engine")
        setup_worker_groups(cfg, self.model_path, started, cfg.trainer.critic.model.path, sources.ref_path,
                            self.total_steps)
        for what, group in (("training", self.group), ("reference", self.ref_group), ("critic", self.critic_group)):
            if group is not None:
                print(f"{what} workers: " + ", ".join(f"rank {r}: {p}" for r, p in enumerate(group.places)),
                      flush=True)
                group.timeout_s = cfg.trainer.actor_call_timeout_s
        if isinstance(self.engine, RemoteEngines):
            self.engine.timeout_s, self.engine.budget = cfg.trainer.actor_call_timeout_s, budget
            self.engine.step_now = lambda: self.current_step  # named when an engine is replaced
        self.weight_sync = make_weight_sync(cfg, self.group, self.engine)
        pad = self.tokenizer.pad_token_id or 0
        self.forward_batching = micro_batching(cfg, self.group.dp_size, pad, train=False)
        self.train_batching = micro_batching(cfg, self.group.dp_size, pad, train=True)
        self.ref_pass = ((self.ref_group, micro_batching(cfg, self.ref_group.dp_size, pad, train=False))
                         if self.ref_group is not None else None)
        # the critic's workers (the policy's, or a group of its own) and how its batches are split for them
        self.critic_workers = self.critic_group or self.group
        self.critic_pass = ((self.critic_workers, micro_batching(cfg, self.critic_workers.dp_size, pad, train=False))
                            if self.value_settings is not None else None)
        self.critic_train_batching = micro_batching(cfg, self.critic_workers.dp_size, pad, train=True)
        self.ckpt_root = checkpoint.root_of(cfg, run_dir)
        self.metrics = MetricsLogger(run_dir, list(cfg.trainer.logger), cfg.trainer.project_name,
                                     cfg.trainer.run_name, config_to_dict(cfg))
        self.position = BatchPosition(0, 0)  # after the last trained batch: what a checkpoint saves
        self.draw_position = self.position
        asynchronous = cfg.trainer.fully_async
        self.rollout_queue = (RolloutQueue(self.queue_jobs(), self.draw_batch, self.encode_batch, self.step_params,
                                           asynchronous.max_staleness_steps) if asynchronous.enabled else None)
        self.current_step = 0  # the step in progress (for the message of an interrupted run)
        clock.mark("workers")

    def actors(self) -> list[tuple[object, str]]:
        """(Ray actor handle, which worker or engine it is) of every actor built so far."""
        groups = [getattr(self, name, None) for name in ("group", "ref_group", "critic_group")]
        engine = getattr(self, "engine", None)
        found = [named for group in groups if group is not None for named in group.named_actors()]
        return found + (engine.named_actors() if isinstance(engine, RemoteEngines) else [])

    def actor_names(self) -> dict[str, str]:
        """Ray actor id -> which worker or engine it is."""
        return {actor._actor_id.hex(): name for actor, name in self.actors()}

    def dead_actor(self) -> str | None:
        """The first actor that no longer answers because it died (one that is busy is not dead)."""
        import ray

        for actor, name in self.actors():
            try:
                ray.get(actor.where.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                return name
            except ray.exceptions.GetTimeoutError:
                continue
        return None

    @property
    def total_steps(self) -> int:
        trainer = self.cfg.trainer
        per_epoch = batches_per_epoch(len(self.train_set), trainer.train_batch_size)
        return trainer.max_steps or trainer.epochs * per_epoch

    def fit(self) -> None:
        start = self.resume()
        if start == 0 and self.cfg.trainer.eval_before_train and self.val_set is not None:
            self.metrics.log({"step": 0, **self.evaluate(0)})
        trainer = self.cfg.trainer
        if self.rollout_queue is not None:
            self.draw_position = self.position
            self.rollout_queue.start(start + 1, engine_version=start)
        for step in range(start + 1, self.total_steps + 1):
            self.current_step = step
            row = self.train_step(step)
            if trainer.max_restarts:
                row["restarts"] = self.restarts
                row["engines_replaced"] = self.budget.engines_replaced if self.budget is not None else 0
            if self.val_set is not None and _due(step, trainer.eval_interval, self.total_steps):
                row.update(self.evaluate(step))
            self.metrics.log(row)
            if _due(step, trainer.ckpt_interval):
                self.save_checkpoint(step)
            if _due(step, trainer.hf_save_interval):
                self.export(step)
        self.metrics.close()

    def draw_batch(self):
        """The next prompt batch after `draw_position` (ahead of `position`, the last trained one, when batches
        are queued)."""
        position = self.draw_position
        batch = next(iter_batches(self.train_set, self.cfg.trainer.train_batch_size, self.cfg.trainer.seed,
                                  position.epoch, position.index))
        self.draw_position = batch.next_position
        return batch

    def encode_batch(self, batch) -> tuple[list[list[int]], list | None]:
        return self.encode(batch.records)

    def encode(self, records) -> tuple[list[list[int]], list | None]:
        """The records' prompts as token ids, and each prompt's images (a vision-language model's; else None)."""
        prompts = self.prompts.encode_all(records)
        return prompts, self.prompts.images_of(records)

    def step_params(self, step: int):
        return components.sampling_params(self.cfg.generator, _seed(self.cfg, step))

    def rollouts_for(self, step: int):
        """(prompt records, rollouts, queue metrics) of `step`: generated now, or taken from the queue."""
        if self.rollout_queue is None:
            self.draw_position = self.position
            batch = self.draw_batch()
            prompts, images = self.encode_batch(batch)
            rollouts, queue_row = self.roll_out(batch.records, prompts, self.step_params(step), images), {}
        else:
            self.rollout_queue.fill(self.total_steps)
            batch, rollouts, queue_row = self.rollout_queue.take(step)
        self.position = batch.next_position
        return batch.records, rollouts, queue_row

    def roll_out(self, records, prompts: list[list[int]], params, images: list | None = None) -> list:
        """Single-turn rollouts (`images`: each prompt's, as encoded), or with `environment.env_class` one
        multi-turn episode per sample."""
        if self.episodes is None:
            return self.generate(prompts, params, images)
        return self.episodes.run(self.generate, records, prompts, params)

    def reward_of(self, records, rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """Each rollout's reward against its prompt's record, and reward metrics; an episode's reward is its
        environment's."""
        if self.episodes is not None:
            return self.episodes.rewards(rollouts)
        return self.rewards.score([r.response_text for r in rollouts], [records[r.prompt_index] for r in rollouts])

    def score(self, records, rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """`reward_of` plus the overlong penalty: what training sees."""
        rewards, row = self.reward_of(records, rollouts)
        finite.non_finite_rewards(rewards, rollouts, records, self.reward_source(), self.cfg.trainer.non_finite)
        band = self.cfg.trainer.algorithm.overlong_buffer
        if band.len:
            lengths = torch.tensor([len(r.response_ids) for r in rollouts])
            rewards = rewards + overlong_penalty(lengths, self.cfg.generator.max_generate_length, band.len,
                                                 band.penalty_factor)
        return rewards, row

    def reward_source(self) -> str:
        """What scores the rollouts, as a message names it."""
        if self.episodes is not None:
            return f"environment.env_class {self.cfg.environment.env_class}"
        return "data.reward_fn"

    def train_step(self, step: int) -> dict:
        cfg, started = self.cfg, time.perf_counter()
        queue_row, reward_rows = {}, []
        prompt_row = {"prompts_truncated": 0}  # over every batch the step generated

        def draw() -> ScoredBatch:
            records, rollouts, row = self.rollouts_for(step)
            queue_row.update(row)
            prompt_row["prompts_truncated"] += self.prompts.truncated_count(records)
            rewards, reward_row = self.score(records, rollouts)
            reward_rows.append(reward_row)
            return ScoredBatch(records, rollouts, rewards)

        algo = cfg.trainer.algorithm
        batch, generated, sampling_row = collect_step_batch(
            draw, algo.dynamic_sampling, cfg.trainer.train_batch_size, cfg.generator.n_samples_per_prompt,
            _seed(cfg, step))
        generated_at = time.perf_counter()
        if not bool(torch.isfinite(batch.rewards).all()):  # trainer.non_finite=skip: no update from this batch
            row = {"skipped_steps": 1.0, **prompt_row, **_merge_reward_rows(reward_rows), **self.sync_weights(step)}
            all_rewards = torch.cat([b.rewards for b in generated])
            row.update(step=step, reward_mean=finite.finite_rewards_mean(all_rewards),
                       step_time_s=time.perf_counter() - started)
            return row
        experience = build_experience(batch.rollouts, batch.rewards,
                                      overlong_filtering=cfg.generator.apply_overlong_filtering)
        masked_row = (mask_zero_variance_groups(experience, algo.zero_variance_filter_tol)
                      if algo.zero_variance_filter else {})
        scored = time.perf_counter()
        compute_logprobs(self.group, self.forward_batching, experience, has_ref=needs_reference(cfg),
                         ref=self.ref_pass, on_policy=self.on_policy, critic=self.critic_pass)
        if cfg.trainer.exact_on_policy:
            anchor_on_rollout(experience)
        forwarded = time.perf_counter()
        token_rewards, row = (self.kl_in_reward.token_rewards(experience) if self.kl_in_reward is not None
                              else (None, {}))
        row.update(assign_advantages(experience, algo.advantage_estimator, algo.grpo_norm_by_std, algo.gamma,
                                     algo.lambd, token_rewards))
        row.update(measure_and_correct(experience, algo.off_policy_correction))
        if algo.policy_loss_type in ROLLOUT_ANCHORED_POLICY_LOSSES:
            anchor_on_rollout(experience)
        row.update(self.update(step, experience))
        row.update(queue_row)
        row.update(prompt_row)
        row.update(sampling_row)
        row.update(masked_row)
        row.update(_merge_reward_rows(reward_rows))
        updated = time.perf_counter()
        row.update(self.sync_weights(step))
        finished = time.perf_counter()
        elapsed = finished - started
        tokens = sum(len(seq["input_ids"]) for seq in experience.sequences)
        all_rewards = torch.cat([b.rewards for b in generated])
        row.update(step=step, reward_mean=float(all_rewards.mean()), step_time_s=elapsed,
                   tokens_per_s=tokens / elapsed, generate_time_s=generated_at - started,
                   logprobs_time_s=forwarded - scored, update_time_s=updated - forwarded,
                   sync_time_s=finished - updated,
                   response_length_mean=float(experience.response_lengths.float().mean()),
                   response_length_max=float(experience.response_lengths.max()))
        return row

    def update(self, step: int, experience: Experience) -> dict[str, float]:
        """The critic's update, then the policy's (none during the critic warm-up), each over
        update_epochs_per_batch passes; the critic's metrics are named `critic_*` (`vf_*` for its loss)."""
        trainer, row = self.cfg.trainer, {}
        epochs, n = trainer.update_epochs_per_batch, self.cfg.generator.n_samples_per_prompt
        if self.value_settings is not None:
            mini = (trainer.critic_mini_batch_size or trainer.policy_mini_batch_size) * n
            critic = update_policy(self.critic_workers, self.critic_train_batching, self.value_settings, experience,
                                   mini, epochs, model="critic")
            row.update({name if name.startswith(("vf_", "values_")) else f"critic_{name}": value
                        for name, value in critic.items() if name != "loss"})  # the loss is vf_loss
            finite.check_update(step, critic, trainer.non_finite)
        if step > trainer.critic_warmup:
            row.update(update_policy(self.group, self.train_batching, self.settings, experience,
                                     trainer.policy_mini_batch_size * n, epochs))
            finite.check_update(step, row, trainer.non_finite)
        return row

    def generate(self, prompts: list[list[int]], params, images: list | None = None) -> list:
        """Rollouts (`images`: each prompt's, for a vision-language model). An engine sharing the workers' devices
        is brought back for the call and offloaded afterwards, so that on a GPU the workers have the memory while
        they run (on CPU both are bookkeeping only)."""
        with_images = {"images": images} if images else {}
        if self.placement.plan.engines:
            return self.engine.generate(prompts, params, **with_images)
        self.engine.reload()
        try:
            return self.engine.generate(prompts, params, **with_images)
        finally:
            self.engine.offload()

    def sync_weights(self, version: int) -> dict[str, float]:
        """The policy after `version` updates to the engines."""
        sent = self.weight_sync.sync(version)
        if hasattr(self.episodes, "weights_updated"):  # agent episodes record each call's policy version
            self.episodes.weights_updated(version)
        if self.rollout_queue is not None:
            self.rollout_queue.weights_updated(version)
        return sent

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """val_accuracy (the mean reward over every sample) and, with k = eval_n_samples_per_prompt > 1,
        val_pass@k and val_mean@k."""
        gen = self.cfg.generator
        records = list(self.val_set)
        prompts, images = self.encode(records)
        rollouts = self.roll_out(records, prompts, components.sampling_params(gen, _seed(self.cfg, step), True),
                                 images)
        rewards, _ = self.reward_of(records, rollouts)
        k = gen.eval_n_samples_per_prompt
        row = {"val_accuracy": float(rewards.mean())}
        if k > 1:
            row[f"val_pass@{k}"], row[f"val_mean@{k}"] = pass_and_mean_at_k(rewards, k)
        return row

    def queue_jobs(self):
        """How the rollout queue generates a batch: one engine call, or the batch's episodes in a thread."""
        if self.episodes is None:
            return SingleTurnJobs(self.engine)
        return EpisodeJobs(self.engine, self.episodes)

    def close(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if getattr(self, "rollout_queue", None) is not None:
            self.rollout_queue.close()
        close_episodes = getattr(self.episodes, "close", None)
        if close_episodes is not None:  # the agents' endpoint
            close_episodes()

    def save_checkpoint(self, step: int) -> None:
        staging = checkpoint.staging_dir(self.ckpt_root, step)
        with write_faults.one_line(f"the checkpoint of step {step}", checkpoint.step_dir(self.ckpt_root, step), staging,
                                   "trainer.ckpt_path"):
            self._write_checkpoint(step, staging)
        checkpoint.apply_retention(self.cfg.trainer, self.ckpt_root, self.metrics.path)

    def trained_groups(self) -> list:
        """The groups holding trained models: the policy's, and a critic group of its own."""
        return [group for group in (self.group, self.critic_group) if group is not None]

    def _write_checkpoint(self, step: int, staging: str) -> None:
        for group in self.trained_groups():  # a critic group of its own writes its part (critic/) alone
            group.call("save_checkpoint", staging)
            unfinite = [label for label, ok in zip(group.labels, group.call("weights_finite"), strict=True) if not ok]
            if unfinite:  # never marked COMPLETE: resume cannot pick it
                raise finite.NonFiniteError(finite.non_finite_weights_line(step, unfinite))
        crash_point("checkpoint_written", step)
        state = {"step": step, "epoch": self.position.epoch, "index": self.position.index,
                 "strategy": self.cfg.trainer.strategy, "model_path": _absolute(self.model_path)}
        if self.kl_in_reward is not None:
            state["kl_ctrl"] = self.kl_in_reward.state_dict()
        if self.value_settings is not None:  # what `rl.launch.convert --model=critic` reads its config from
            state["critic_model_path"] = _absolute(self.cfg.trainer.critic.model.path or self.model_path)
        checkpoint.commit(self.ckpt_root, step, state)

    def resume(self) -> int:
        mode = self.cfg.trainer.resume_mode
        if mode in (None, "none"):
            return 0
        path = checkpoint.latest(self.ckpt_root) if mode == "latest" else mode
        if path is None:  # nothing complete to resume from: start over, without the earlier attempt's rows
            self.metrics.truncate_after(-1)
            return 0
        if not checkpoint.is_complete(path):
            raise ValueError(f"trainer.resume_mode: {path} is not a complete checkpoint (no {checkpoint.MARKER})")
        damaged = checkpoint.verify(path)
        if damaged:
            raise ValueError(f"trainer.resume_mode: {path} is damaged: {'; '.join(damaged)}; resume from another "
                             "checkpoint (trainer.resume_mode=latest picks the newest intact one)")
        mismatch = checkpoint.strategy_mismatch(path, self.cfg.trainer.strategy)
        if mismatch:
            raise ValueError(f"trainer.resume_mode: {mismatch}")
        state = checkpoint.read_trainer_state(path)
        for group in self.trained_groups():
            group.call("load_checkpoint", path)
        self.position = BatchPosition(state["epoch"], state["index"])
        if self.kl_in_reward is not None and "kl_ctrl" in state:
            self.kl_in_reward.load_state_dict(state["kl_ctrl"])
        self.metrics.truncate_after(state["step"])
        self.sync_weights(int(state["step"]))
        print(f"resumed from {path} (step {state['step']})", flush=True)
        return int(state["step"])

    def export(self, step: int) -> None:
        root = self.cfg.trainer.export_path or os.path.join(self.run_dir, "exports")
        exports = [("export_hf", os.path.join(root, f"global_step_{step}"), "the export")]
        if self.value_settings is not None:
            critic = os.path.join(root, "critic", f"global_step_{step}")
            exports.append(("export_critic", critic, "the critic's export"))
        for method, path, what in exports:
            with write_faults.one_line(f"{what} of step {step}", path, path + ".partial", "trainer.export_path"):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                group = self.critic_workers if method == "export_critic" else self.group
                group.call(method, self.model_path, path)


def _absolute(model_path: str) -> str:
    """A local model directory as an absolute path (hub names stay as they are)."""
    local = os.path.expanduser(model_path)
    return os.path.abspath(local) if os.path.isdir(local) else model_path


def _merge_reward_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    """The reward metrics of every batch a step generated: means averaged, errors added up."""
    merged: dict[str, list[float]] = {}
    for row in rows:
        for name, value in row.items():
            merged.setdefault(name, []).append(value)
    return {name: sum(values) if name == "reward_errors" else sum(values) / len(values)
            for name, values in merged.items()}


def _due(step: int, interval: int, last: int | None = None) -> bool:
    return bool(interval) and (step % interval == 0 or step == last)


def _seed(cfg, step: int) -> int:
    return cfg.trainer.seed * 100_003 + step
