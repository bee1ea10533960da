"""Scores rollouts with the configured reward functions: each function on each response (in the reward pool),
summed with `data.reward_weights`, with the failures handled as `data.reward_on_error` says and the per-function
means and extra metrics returned for the step's log."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

from rl.core.data.records import PromptRecord
from rl.core.rewards.functions import (
    RewardFunctionSpec,
    call_reward,
    failure_text,
    load_reward_function,
    reward_specs,
)
from rl.trainer.reward_pool import RewardJob, RewardOutcome, RewardPool

SHOWN_ERRORS = 3  # error lines printed per step with reward_on_error=zero (all are counted)


class RewardError(RuntimeError):
    """A reward call failed with data.reward_on_error=fail; the message names the function and the row."""


def row_fields(record: PromptRecord) -> dict:
    """What a reward function may ask for by name: the row's other columns, its prompt, data source and index."""
    prompt = record.prompt if isinstance(record.prompt, str) else record.messages()
    return {**record.fields, "prompt": prompt, "data_source": record.data_source, "index": record.index}


def describe_row(record: PromptRecord) -> str:
    return record.where or f"row index {record.index} of {record.data_source}"


class RewardScorer:
    def __init__(self, data_cfg):
        self.specs: list[RewardFunctionSpec] = reward_specs(data_cfg.reward_fn, data_cfg.reward_weights)
        self.on_error = data_cfg.reward_on_error
        references = [spec.reference for spec in self.specs]
        if data_cfg.reward_num_workers > 0:
            self.pool = RewardPool(references, data_cfg.reward_num_workers, data_cfg.reward_timeout_s)
            self.functions = None
        else:
            self.pool = None
            self.functions = [load_reward_function(reference) for reference in references]

    def _run(self, jobs: list[RewardJob]) -> list[RewardOutcome]:
        if self.pool is not None:
            return self.pool.run(jobs)
        outcomes = []
        for job in jobs:
            try:
                value = call_reward(self.functions[job.function], job.response, job.answer, job.fields)
                outcomes.append(RewardOutcome(value, None))
            except Exception as error:  # handled as data.reward_on_error says
                outcomes.append(RewardOutcome(None, failure_text(error)))
        return outcomes

    def score(self, responses: Sequence[str], records: Sequence[PromptRecord]) -> tuple[Tensor, dict[str, float]]:
        """([B] summed rewards, metrics) of `responses[b]` against `records[b]`."""
        fields = [row_fields(record) for record in records]
        jobs = [RewardJob(f, response, record.answer, row)
                for response, record, row in zip(responses, records, fields, strict=True)
                for f in range(len(self.specs))]
        outcomes = self._run(jobs)
        total = torch.zeros(len(responses))
        per_function: dict[str, list[float]] = defaultdict(list)
        errors = []
        for j, (job, outcome) in enumerate(zip(jobs, outcomes, strict=True)):
            spec, b = self.specs[job.function], j // len(self.specs)
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
