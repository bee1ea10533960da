"""ClassifierReward against tiny real sequence classifiers: batched, padded scores equal each text scored alone,
whatever padding side the saved tokenizer defaults to; non-classifier and multi-label checkpoints are refused.

GPT-2 is there because it learns absolute position embeddings: Llama's rotary positions are relative, so only GPT-2
notices when padding shifts a text's positions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoTokenizer,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerBase,
)

from rl.core.rewards.reward_model import PATH_KEY, ClassifierReward
from rl.tasks.embedded.tokenizer import build_tokenizer
from tests.testing import tolerances

TEXTS = [
    ("What is 2 + 3?", " 5"),
    ("What is 12 * 4?", " Answer: 48 #### 48"),
    ("7", ""),
    ("What is 100 - 1?", " 99."),
    ("after 3, 4", ", 5, 6, 7, 8, 9"),
    ("What is 9 + 9? Answer", " is 18"),
]


def tiny_config(tokenizer: PreTrainedTokenizerBase, num_labels: int = 1) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def make_classifier(
    tokenizer: PreTrainedTokenizerBase, num_labels: int = 1, arch: str = "llama"
) -> torch.nn.Module:
    """A classifier with weights drawn from a fixed seed; a wide init spreads its scores apart."""
    if arch == "gpt2":
        ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
        config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=128,
                            initializer_range=0.3, num_labels=num_labels, **ids)
        model_class = GPT2ForSequenceClassification
    else:
        config, model_class = tiny_config(tokenizer, num_labels), LlamaForSequenceClassification
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return model_class(config).eval()


def save(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def alone(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, text: str) -> float:
    """The oracle: the model on one unpadded text, in float64 (the checkpoint's float32 weights widen exactly)."""
    with torch.no_grad():
        return float(model.double()(**tokenizer(text, return_tensors="pt")).logits[0, 0])


def assert_scores_match(scores: list[float], expected: list[float], model: torch.nn.Module, length: int) -> None:
    """Batched and single scores, both computed in float64, differ only by summation order.

    The score passes through, per layer, two norms and four projections over the hidden size, the MLP's reduction
    over its inner size, one over a head's width and two over the sequence (softmax, weighted sum), then a norm and
    the score head. `tolerances.network_rtol` bounds two orders of that chain; the condition allowance of 1e3 covers
    the cancellation of a random network's terms. The bound (~1e-10) is far below the ~1e-1 a text read at a padded
    position or with shifted positions moves a score, and far below float32's rounding, which any CPU kernel path
    reaches with a batched matmul.
    """
    c = model.config
    inner = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size
    per_layer = [c.hidden_size] * 6 + [inner, c.hidden_size // c.num_attention_heads, length, length]
    rtol = tolerances.network_rtol(per_layer * c.num_hidden_layers + [c.hidden_size] * 2, torch.float64,
                                   condition=1e3)
    assert scores == pytest.approx(expected, rel=rtol, abs=rtol * max(abs(x) for x in expected))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_scores_equal_each_text_alone(tmp_path, padding_side, arch):
    tokenizer = build_tokenizer()
    tokenizer.padding_side = padding_side
    model = make_classifier(tokenizer, arch=arch)
    path = save(model, tokenizer, tmp_path / "rm")
    assert AutoTokenizer.from_pretrained(path).padding_side == padding_side  # the default the class must override

    reward = ClassifierReward(str(path), batch_size=4, dtype=torch.float64)
    scores = reward.score([p for p, _ in TEXTS], [r for _, r in TEXTS])

    expected = [alone(model, tokenizer, p + r) for p, r in TEXTS]
    lengths = {len(tokenizer(p + r)["input_ids"]) for p, r in TEXTS}
    assert len(lengths) > 2  # the batches really are padded
    assert_scores_match(scores, expected, model, max(lengths))
    assert len(set(scores)) == len(scores)  # the texts are told apart, not all read at one position


def test_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    tokenizer = build_tokenizer()
    model = make_classifier(tokenizer)
    model.config.pad_token_id = None
    tokenizer.pad_token = None
    path = save(model, tokenizer, tmp_path / "rm")

    reward = ClassifierReward(str(path), batch_size=4, dtype=torch.float64)
    assert reward.tokenizer.pad_token == tokenizer.eos_token
    assert reward.model.config.pad_token_id == tokenizer.eos_token_id

    scores = reward.score([p for p, _ in TEXTS], [r for _, r in TEXTS])
    length = max(len(tokenizer(p + r)["input_ids"]) for p, r in TEXTS)
    assert_scores_match(scores, [alone(model, tokenizer, p + r) for p, r in TEXTS], model, length)


def test_causal_lm_directory_is_refused(tmp_path):
    tokenizer = build_tokenizer()
    path = save(LlamaForCausalLM(tiny_config(tokenizer)), tokenizer, tmp_path / "lm")
    for refuse in (ClassifierReward.check_path, ClassifierReward):
        with pytest.raises(ValueError, match="ForSequenceClassification") as error:
            refuse(str(path))
        assert PATH_KEY in str(error.value) and "LlamaForCausalLM" in str(error.value)


def test_multi_label_classifier_is_refused(tmp_path):
    tokenizer = build_tokenizer()
    path = save(make_classifier(tokenizer, num_labels=2), tokenizer, tmp_path / "rm2")
    for refuse in (ClassifierReward.check_path, ClassifierReward):
        with pytest.raises(ValueError, match="num_labels=2") as error:
            refuse(str(path))
        assert PATH_KEY in str(error.value)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a directory") as error:
        ClassifierReward.check_path(str(tmp_path / "absent"))
    assert PATH_KEY in str(error.value)


def test_mismatched_lengths_are_refused(tmp_path):
    tokenizer = build_tokenizer()
    reward = ClassifierReward(str(save(make_classifier(tokenizer), tokenizer, tmp_path / "rm")))
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        reward.score(["a", "b"], ["c"])
    assert reward.score([], []) == []
