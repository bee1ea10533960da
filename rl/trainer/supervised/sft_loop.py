"""The SFT driver: chat-format or prompt/response rows, the loss on assistant tokens (`rl.core.algorithms.sft_loss`)
through the run's strategy, validation loss on `data.val_data`; the loop itself is `supervised.SupervisedTrainer`.
A vision-language model's rows may hold images (`rl.core.data.supervised`), encoded with its processor.

With `trainer.policy.model.path=embedded` the run starts from the embedded job's untrained small model and trains
on its warm-up demonstrations (`rl.tasks.embedded.supervised`), and each evaluation adds the greedy validation
accuracy under the task's verifier.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from rl.core.algorithms.sft_loss import SftLossSettings
from rl.core.config.supervised import SftConfig
from rl.core.data.supervised import load_sft_examples
from rl.tasks.jobs import EMBEDDED
from rl.trainer.supervised.driver import SupervisedTrainer, run_supervised
from rl.trainer.supervised.preflight import data_spec

GREEDY_MAX_NEW_TOKENS = 32


class GreedyCheck:
    """Greedy accuracy of the embedded task's validation problems, on the driver, from the policy's weights."""

    def __init__(self, model_path: str, rows: list[dict]):
        from transformers import AutoTokenizer

        self.model_path, self.rows = model_path, rows
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    def __call__(self, state: dict[str, torch.Tensor]) -> float:
        from transformers import AutoModelForCausalLM

        from rl.tasks.embedded.warmup import greedy_accuracy

        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        result = model.load_state_dict({name: value.float() for name, value in state.items()}, strict=False)
        if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:  # only a tied head may be absent
            raise RuntimeError(f"the policy's weights do not fit {self.model_path}: unexpected "
                               f"{result.unexpected_keys[:3]}, missing {result.missing_keys[:3]}")
        return greedy_accuracy(model, self.tokenizer, self.rows, GREEDY_MAX_NEW_TOKENS)


def embedded_validation_rows(seed: int) -> list[dict]:
    from rl.tasks.embedded.prepare import Recipe
    from rl.tasks.embedded.task import make_task_rows

    return make_task_rows(Recipe.n_val, seed, "validation")


class SftTrainer(SupervisedTrainer):
    kind = "sft"

    def __init__(self, cfg, run_dir: str, block: SftConfig):
        from transformers import AutoTokenizer

        model_path, train, val, embedded = _sources(cfg, run_dir)
        if embedded and block.response_key == SftConfig.response_key:
            from rl.tasks.embedded.warmup import RESPONSE_KEY

            block = dataclasses.replace(block, response_key=RESPONSE_KEY)
        from rl.trainer.components import image_processor

        spec = data_spec("sft", block)
        encoder = image_processor(model_path) or AutoTokenizer.from_pretrained(model_path)  # images: the processor
        self.train = load_sft_examples(encoder, train, spec)
        self.val = load_sft_examples(encoder, val, spec) if val else None
        self.greedy = GreedyCheck(model_path, embedded_validation_rows(cfg.trainer.seed)) if embedded else None
        self.settings = SftLossSettings(loss_reduction=block.loss_reduction)
        print(f"sft: {len(self.train)} training examples, {len(self.val or [])} validation examples", flush=True)
        super().__init__(cfg, run_dir, model_path, len(self.train), block.max_length, with_ref=False)

    def batch_sequences(self, rows: list[int]) -> list[dict]:
        return [dict(self.train[i]) for i in rows]

    def evaluate(self, step: int) -> dict[str, float]:
        row = {}
        if self.val:
            logprobs = self.logprobs([dict(s) for s in self.val])
            nll = sum(float(-(lp * s["loss_mask"]).sum()) for lp, s in zip(logprobs, self.val, strict=True))
            row["val_loss"] = nll / max(sum(int(s["loss_mask"].sum()) for s in self.val), 1)
        if self.greedy is not None:
            row["val_accuracy"] = self.greedy(self.full_state_dict())
        return row


def _sources(cfg, run_dir: str) -> tuple[str, list[str], list[str], bool]:
    """(model path, train files, validation files, whether the embedded job is used)."""
    model_path, train, val = cfg.trainer.policy.model.path, list(cfg.data.train_data), list(cfg.data.val_data or [])
    embedded = EMBEDDED in (model_path, *train, *val)
    if embedded:
        from rl.tasks.embedded.supervised import write_sft_job

        job = write_sft_job(os.path.join(run_dir, "embedded"), cfg.trainer.seed)
        model_path = str(job.model_path) if model_path == EMBEDDED else model_path
        train = [str(job.train_data) if p == EMBEDDED else p for p in train]
        val = [str(job.val_data) if p == EMBEDDED else p for p in val]
    return model_path, train, val, embedded and cfg.trainer.policy.model.path == EMBEDDED


def run_sft(cfg, block: SftConfig, run_dir: str | None = None, ray_address: str | None = None) -> str:
    return run_supervised(cfg, "sft", block, lambda cfg, run_dir: SftTrainer(cfg, run_dir, block), run_dir,
                          ray_address)
