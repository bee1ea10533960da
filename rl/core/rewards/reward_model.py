"""A Hugging Face sequence-classification model used as a reward: one scalar logit per `prompt + response` text.

This is the learned reward model of RLHF (TRL's reward-model checkpoints, SkyRL's `trainer.reward.model.path`). The
checkpoint directory must hold a `*ForSequenceClassification` model with a single output label; a causal LM there
would load with a freshly initialised score head and hand out random rewards without complaint, so it is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PretrainedConfig

PATH_KEY = "trainer.reward.model.path"
CLASSIFIER_SUFFIX = "ForSequenceClassification"


class ClassifierReward:
    """Scores texts with a sequence classifier's single logit, `batch_size` texts per forward pass.

    Batches are right-padded with an attention mask. Under a causal mask the padding after a text cannot change
    its hidden states, and its position ids stay 0..len-1, so a batched score equals the score of the text alone.
    The model reads its score at the rightmost token that is not `config.pad_token_id`, so that id is set to the
    tokenizer's pad id (the id the batches are padded with).

    Args:
        path: local directory holding the classifier's config, weights and tokenizer.
        device: where the model runs.
        batch_size: most texts per forward pass; bounds memory.
        dtype: dtype to load the weights in; None keeps the checkpoint's own ("auto").
    """

    def __init__(self, path: str, device: str | torch.device = "cpu", batch_size: int = 8, dtype: Any = None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.check_path(path)
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # Right padding keeps every text's positions as they are unpadded (left padding would shift them).
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            if self.tokenizer.eos_token is None:
                raise ValueError(f"{PATH_KEY}: the tokenizer in {path} has neither a pad nor an eos token to pad with")
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype or "auto")
        # The classifier finds each text's last token as the rightmost one that is not its pad id.
        self.model.config.get_text_config().pad_token_id = self.tokenizer.pad_token_id
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device).eval().requires_grad_(False)

    @staticmethod
    def check_path(path: str | os.PathLike) -> None:
        """Refuse `path` unless it is a directory whose config.json describes a one-label sequence classifier.

        Reads the config only (no weights), so it can run when the run's config is loaded.
        """
        if not Path(path).is_dir():
            raise ValueError(f"{PATH_KEY}: {str(path)!r} is not a directory; give a local checkpoint directory")
        try:
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise ValueError(f"{PATH_KEY}: cannot read a model config from {str(path)!r}: {error}") from error
        check_config(config, str(path))

    @torch.no_grad()
    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        """The classifier's logit for each `prompt + response` (plain concatenation, tokenized as one text)."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses; give one response per prompt")
        texts = [prompt + response for prompt, response in zip(prompts, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size], padding=True, return_tensors="pt"
            ).to(self.device)
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            scores.extend(logits[:, 0].double().tolist())  # exact for every dtype: a float64 model keeps its digits
        return scores


def check_config(config: PretrainedConfig, path: str) -> None:
    """Refuse a config that is not a sequence classifier with exactly one label."""
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith(CLASSIFIER_SUFFIX) for name in architectures):
        found = ", ".join(architectures) if architectures else "no architectures listed"
        raise ValueError(
            f"{PATH_KEY}: {path!r} is not a sequence-classification model (config.json: {found}); expected an "
            f"architecture ending in {CLASSIFIER_SUFFIX} (e.g. LlamaForSequenceClassification). A causal LM "
            "loaded as a classifier gets a randomly initialised score head, so its rewards would be noise."
        )
    if config.num_labels != 1:
        raise ValueError(
            f"{PATH_KEY}: {path!r} has num_labels={config.num_labels}; a reward model needs num_labels=1, "
            "whose single logit is the scalar reward (with more labels there is no one score to use)."
        )
