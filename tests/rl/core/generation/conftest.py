"""Tiny Qwen2 and GPT-2 models built from a config and a character-level tokenizer, so the tests need no downloads."""

from __future__ import annotations

import pytest
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from rl.core.generation import HFGenerationEngine

VOCAB_SIZE = 64
SPECIAL = ["<pad>", "<eos>", "<unk>"]
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,!?+-=*/()ABCDEFGHIJKLM"


def build_tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIAL + list(CHARS))}
    assert len(vocab) == VOCAB_SIZE
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def build_model(seed: int, tied: bool = False, arch: str = "qwen2") -> transformers.PreTrainedModel:
    """A 2-layer model with weights drawn from `seed`; a wide init makes its next-token distributions peaked.

    "qwen2" uses rotary positions (relative); "gpt2" learns absolute position embeddings, so only it notices
    position ids that are off by the padding.
    """
    common = {"vocab_size": VOCAB_SIZE, "initializer_range": 0.3, "tie_word_embeddings": tied}
    if arch == "gpt2":
        ids = {"bos_token_id": 1, "eos_token_id": 1}  # the tokenizer's <eos>
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **ids, **common)
        model_class = transformers.GPT2LMHeadModel
    else:
        config = transformers.Qwen2Config(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            **common,
        )
        model_class = transformers.Qwen2ForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer() -> transformers.PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="session")
def vocab() -> list[str]:
    """Token strings by id."""
    return SPECIAL + list(CHARS)


@pytest.fixture(scope="session")
def make_model():
    """`make_model(seed, tied=False, arch="qwen2")` -> a fresh tiny model (same seed, same weights)."""
    return build_model


@pytest.fixture
def make_engine(tokenizer):
    """`make_engine(seed, tied=False, arch="qwen2", **engine_kwargs)` -> an "hf" engine over a fresh tiny model."""

    def make(seed: int = 0, tied: bool = False, arch: str = "qwen2", **kwargs) -> HFGenerationEngine:
        return HFGenerationEngine(build_model(seed, tied, arch), tokenizer, **kwargs)

    return make


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    """Prompts of different lengths, so batches need left padding."""
    texts = ["what is 2+3?", "hi", "count: 1, 2, 3,", "q", "the quick brown fox"]
    return [tokenizer(text)["input_ids"] for text in texts]


@pytest.fixture(scope="session")
def greedy_reference():
    """`greedy_reference(model, prompt, max_new_tokens, stop_ids)` -> the argmax continuation, decoded by hand."""
    return _greedy_reference


def _greedy_reference(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, stop: set[int]) -> list[int]:
    """Argmax decoding by hand: one full forward pass over the whole sequence per new token, no cache, no padding."""
    sequence = list(prompt)
    response: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([sequence])).logits[0, -1]
            token = int(logits.argmax())
            response.append(token)
            sequence.append(token)
            if token in stop:
                break
    return response
