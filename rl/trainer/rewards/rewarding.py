"""Scores rollouts with the configured reward functions: each function on each response (in the reward pool),
summed with `data.reward_weights`, with the failures handled as `data.reward_on_error` says and the per-function
means and extra metrics returned for the step's log."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

from rl.core.config.choices import MODEL_REWARDS
from rl.core.data.records import PromptRecord, describe_row
from rl.core.rewards.functions import (
    RewardFunctionSpec,
    call_reward,
    failure_text,
    load_reward_function,
    reward_specs,
)
from rl.core.user_code import UserExit
from rl.trainer.rewards.reward_pool import RewardJob, RewardOutcome, RewardPool

SHOWN_ERRORS = 3  # error lines printed per step with reward_on_error=zero (all are counted)


class RewardError(RuntimeError):
    """A reward call failed with data.reward_on_error=fail; the message names the function and the row."""


def row_fields(record: PromptRecord) -> dict:
    """What a reward function may ask for by name: the row's other columns, its prompt, data source and index."""
    prompt = record.prompt if isinstance(record.prompt, str) else record.messages()
    return {**record.fields, "prompt": prompt, "data_source": record.data_source, "index": record.index}


def prompt_text(record: PromptRecord) -> str:
    """The prompt as a reward model reads it: the text, or the chat messages' contents one per line."""
    return record.prompt if isinstance(record.prompt, str) else "\n".join(m.content for m in record.prompt)


class RewardScorer:
    """`models`: name -> score function of the models of trainer.reward (`reward_models.start_reward_models`);
    data.reward_fn entries with those names are scored by them, the others by the functions."""

    def __init__(self, data_cfg, models: dict | None = None):
        self.specs: list[RewardFunctionSpec] = reward_specs(data_cfg.reward_fn, data_cfg.reward_weights)
        self.on_error = data_cfg.reward_on_error
        self.models = dict(models or {})
        missing = [spec.reference for spec in self.specs if spec.reference in MODEL_REWARDS
                   and spec.reference not in self.models]
        if missing:
            raise ValueError(f"data.reward_fn lists {', '.join(missing)} but no such model was started")
        self.function_specs = [f for f, spec in enumerate(self.specs) if spec.reference not in self.models]
        references = [self.specs[f].reference for f in self.function_specs]
        if not references:
            self.pool, self.functions = None, []
        elif data_cfg.reward_num_workers > 0:
            self.pool = RewardPool(references, data_cfg.reward_num_workers, data_cfg.reward_timeout_s)
            self.functions = None
        else:
            self.pool = None
            self.functions = [load_reward_function(reference) for reference in references]

    def _run(self, jobs: list[RewardJob]) -> list[RewardOutcome]:
        if self.pool is not None:
            return self.pool.run(jobs)
        if not jobs:
            return []
        outcomes = []
        for job in jobs:
            try:
                value = call_reward(self.functions[job.function], job.response, job.answer, job.fields)
                outcomes.append(RewardOutcome(value, None))
            except UserExit as error:  # ends the run whatever data.reward_on_error says
                outcomes.append(RewardOutcome(None, str(error), fatal=True))
            except Exception as error:  # handled as data.reward_on_error says
                outcomes.append(RewardOutcome(None, failure_text(error)))
        return outcomes

    def _outcomes(self, responses: Sequence[str], records: Sequence[PromptRecord]) -> list[list[RewardOutcome]]:
        """[function][row] outcomes: the functions' calls in the pool, each model's as one batch."""
        fields = [row_fields(record) for record in records]
        jobs = [RewardJob(j, response, record.answer, row)
                for response, record, row in zip(responses, records, fields, strict=True)
                for j in range(len(self.function_specs))]
        done = self._run(jobs)
        outcomes: list[list[RewardOutcome]] = [[] for _ in self.specs]
        for job, outcome in zip(jobs, done, strict=True):
            outcomes[self.function_specs[job.function]].append(outcome)
        for f, spec in enumerate(self.specs):
            if spec.reference in self.models:
                scores = self.models[spec.reference]([prompt_text(r) for r in records], list(responses),
                                                     [r.answer for r in records])
                outcomes[f] = [_model_outcome(score) for score in scores]
        return outcomes

    def score(self, responses: Sequence[str], records: Sequence[PromptRecord]) -> tuple[Tensor, dict[str, float]]:
        """([B] summed rewards, metrics) of `responses[b]` against `records[b]`."""
        outcomes = self._outcomes(responses, records)
        total = torch.zeros(len(responses))
        per_function: dict[str, list[float]] = defaultdict(list)
        errors = []
        for spec, column in zip(self.specs, outcomes, strict=True):
            failed = [b for b, outcome in enumerate(column) if outcome.error is not None and not outcome.fatal]
            if column and len(failed) == len(column) and self.on_error == "zero":
                raise RewardError(f"data.reward_fn: {spec.reference} failed on all {len(column)} responses of this "
                                  f"batch, the first on {describe_row(records[0])}: {column[0].error}; "
                                  "data.reward_on_error=zero scores a failed call 0, but a function that never "
                                  "works gives nothing to learn from: fix it")
            for b, outcome in enumerate(column):
                if outcome.fatal:
                    raise RewardError(f"data.reward_fn: {spec.reference} on {describe_row(records[b])}: "
                                      f"{outcome.error}")
                if outcome.error is not None:
                    errors.append(f"data.reward_fn: {spec.reference} failed on {describe_row(records[b])}: "
                                  f"{outcome.error}")
                    continue
                score, extras = outcome.value
                total[b] += spec.weight * score
                per_function[f"reward/{spec.name}"].append(score)
                for name, value in extras.items():
                    per_function[f"reward/{spec.name}/{name}"].append(value)
        if errors and self.on_error == "fail":
            raise RewardError(f"{errors[0]} ({len(errors)} failed call(s) in this batch; set "
                              "data.reward_on_error=zero to score such calls 0 and go on)")
        for line in errors[:SHOWN_ERRORS]:
            print(f"warning: {line}; scored 0 (data.reward_on_error=zero)", flush=True)
        metrics = {name: sum(values) / len(values) for name, values in per_function.items()}
        metrics["reward_errors"] = float(len(errors))
        return total, metrics

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _model_outcome(score: float | None) -> RewardOutcome:
    if score is None:
        return RewardOutcome(None, "the judge's answer holds no score matching trainer.reward.judge.pattern")
    if not math.isfinite(score):
        return RewardOutcome(None, f"the model's score is {score}, not a finite number")
    return RewardOutcome((float(score), {}), None)
