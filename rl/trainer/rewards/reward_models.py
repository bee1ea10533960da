"""The models of `trainer.reward`, each in a Ray actor of its own: the sequence classifier (`reward_model`) and the
LLM judge (`llm_judge`, a causal LM behind a generation engine). The driver sends a batch's prompts, responses and
answers and gets one score per response (None where the judge's answer held no score)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rl.backends.lifeline import exit_with_parent
from rl.core.config.choices import MODEL_REWARDS

ModelScore = Callable[[list[str], list[str], list[str]], list[float | None]]


class RewardModelActor:
    def __init__(self, kind: str, reward_cfg: dict[str, Any]):
        exit_with_parent()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.kind = kind
        if kind == "reward_model":
            from rl.core.rewards.reward_model import ClassifierReward

            self.model = ClassifierReward(reward_cfg["model"]["path"], device, reward_cfg["batch_size"])
        else:
            from transformers import AutoTokenizer

            from rl.core.generation import build_engine
            from rl.core.rewards.judge import JudgeReward

            judge = reward_cfg["judge"]
            tokenizer = AutoTokenizer.from_pretrained(judge["model_path"])
            engine = build_engine(judge["backend"], judge["model_path"], tokenizer)
            self.model = JudgeReward(engine, tokenizer, judge["template"], judge["pattern"], judge["max_new_tokens"])

    def score(self, prompts: list[str], responses: list[str], answers: list[str]) -> list[float | None]:
        if self.kind == "reward_model":
            return self.model.score(prompts, responses)
        return self.model.score(prompts, responses, answers)


def start_reward_models(cfg, names: list[str], timeout_s: float | None,
                        options: dict[str, Any]) -> dict[str, ModelScore]:
    """name -> score function of every model of trainer.reward that `names` (data.reward_fn) lists, each in an actor
    placed by `options` (`Placement.guest_options`: beside the training workers)."""
    import dataclasses

    import ray

    reward_cfg = dataclasses.asdict(cfg.trainer.reward)
    remote = ray.remote(RewardModelActor).options(**options)
    actors = {name: remote.remote(name, reward_cfg) for name in names if name in MODEL_REWARDS}

    def scorer(actor) -> ModelScore:
        return lambda prompts, responses, answers: ray.get(actor.score.remote(prompts, responses, answers),
                                                           timeout=timeout_s)

    return {name: scorer(actor) for name, actor in actors.items()}
