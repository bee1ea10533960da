"""The DPO driver: (prompt, chosen, rejected) pairs, the frozen reference's logprobs each step, the sigmoid or IPO
loss with an optional SFT term (`rl.core.algorithms.dpo_loss`) through the run's strategy; validation preference
accuracy and margin on `data.val_data`. The loop itself is `supervised.SupervisedTrainer`.

With `trainer.policy.model.path=embedded` the run starts from the embedded job's warmed-up (careless) model and
trains on the embedded preference set (`rl.tasks.embedded.supervised`): a correct and a careless answer to each
carrying problem; each evaluation adds the greedy validation accuracy under the task's verifier.
"""

from __future__ import annotations

import os

import torch

from rl.core.algorithms.dpo_loss import DpoLossSettings, preference_terms
from rl.core.config.supervised import DpoConfig
from rl.core.data.supervised import load_preference_pairs
from rl.tasks.jobs import EMBEDDED
from rl.trainer.batching import attach
from rl.trainer.supervised.driver import SupervisedTrainer, run_supervised
from rl.trainer.supervised.preflight import data_spec
from rl.trainer.supervised.sft_loop import GreedyCheck, embedded_validation_rows


class DpoTrainer(SupervisedTrainer):
    kind = "dpo"

    def __init__(self, cfg, run_dir: str, block: DpoConfig):
        from transformers import AutoTokenizer

        model_path, train, val, embedded = _sources(cfg, run_dir)
        spec = data_spec("dpo", block)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.train = load_preference_pairs(tokenizer, train, spec)
        self.val = load_preference_pairs(tokenizer, val, spec) if val else None
        self.val_ref: list | None = None  # the reference's logprobs of the validation pairs, computed once
        self.greedy = GreedyCheck(model_path, embedded_validation_rows(cfg.trainer.seed)) if embedded else None
        self.settings = DpoLossSettings(beta=block.beta, loss_type=block.loss_type,
                                        preference_loss_weight=block.preference_loss_weight,
                                        sft_loss_weight=block.sft_loss_weight,
                                        sft_average_log_probs=block.sft_average_log_probs,
                                        preference_average_log_probs=block.preference_average_log_probs)
        print(f"dpo: {len(self.train)} training pairs, {len(self.val or [])} validation pairs", flush=True)
        super().__init__(cfg, run_dir, model_path, len(self.train), block.max_length, with_ref=True, paired=True)

    def batch_sequences(self, rows: list[int]) -> list[dict]:
        return [dict(seq) for i in rows for seq in self.train[i]]

    def prepare_step(self, sequences: list[dict]) -> None:
        attach(sequences, "ref_logprobs", self.logprobs(sequences, "ref"))

    def evaluate(self, step: int) -> dict[str, float]:
        row = {}
        if self.val:
            sequences = [dict(seq) for pair in self.val for seq in pair]
            if self.val_ref is None:
                self.val_ref = self.logprobs(sequences, "ref")
            row.update(self.preference_metrics(sequences, self.logprobs(sequences)))
        if self.greedy is not None:
            row["val_accuracy"] = self.greedy(self.full_state_dict())
        return row

    def preference_metrics(self, sequences: list[dict], logprobs: list) -> dict[str, float]:
        lp = torch.cat([t.float() for t in logprobs])
        ref = torch.cat([t.float() for t in self.val_ref])
        mask = torch.cat([s["loss_mask"] for s in sequences])
        ids = torch.repeat_interleave(torch.arange(len(sequences)), torch.tensor([len(s["loss_mask"])
                                                                                for s in sequences]))
        terms = preference_terms(self.settings, lp, ref, mask, ids, len(sequences))
        beta = self.settings.beta
        return {"val_dpo_loss": float(terms["loss"].mean()),
                "val_preference_accuracy": float((terms["h_w"] > terms["h_l"]).float().mean()),
                "val_reward_margin": float((beta * (terms["h_w"] - terms["h_l"])).mean())}


def _sources(cfg, run_dir: str) -> tuple[str, list[str], list[str], bool]:
    model_path, train, val = cfg.trainer.policy.model.path, list(cfg.data.train_data), list(cfg.data.val_data or [])
    if model_path == EMBEDDED:
        from rl.tasks.embedded.cache import default_cache_dir
        from rl.tasks.embedded.prepare import prepare_embedded_default

        model_path = str(prepare_embedded_default(os.path.join(run_dir, "embedded"), seed=cfg.trainer.seed,
                                                  cache_dir=default_cache_dir()).model_path)
    if EMBEDDED in (*train, *val):
        from rl.tasks.embedded.supervised import write_preference_set

        pairs = write_preference_set(os.path.join(run_dir, "embedded", "preferences"), seed=cfg.trainer.seed)
        train = [str(pairs[0]) if p == EMBEDDED else p for p in train]
        val = [str(pairs[1]) if p == EMBEDDED else p for p in val]
    return model_path, train, val, cfg.trainer.policy.model.path == EMBEDDED


def run_dpo(cfg, block: DpoConfig, run_dir: str | None = None, ray_address: str | None = None) -> str:
    return run_supervised(cfg, "dpo", block, lambda cfg, run_dir: DpoTrainer(cfg, run_dir, block), run_dir,
                          ray_address)
