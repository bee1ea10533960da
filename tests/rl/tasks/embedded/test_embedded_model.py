"""The embedded model: its config fits the tokenizer, initialisation follows the seed, checkpoints reload exactly."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl.tasks.embedded.model import build_model, save_pretrained_model, tiny_model_config
from rl.tasks.embedded.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def config(tokenizer):
    return tiny_model_config(tokenizer)


def test_config_fits_the_tokenizer(tokenizer, config):
    assert config.vocab_size == len(tokenizer)
    assert config.hidden_size // config.num_attention_heads >= 16
    assert config.tie_word_embeddings
    assert (config.pad_token_id, config.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="huge"):
        tiny_model_config(tokenizer, size="huge")


def test_initialisation_follows_the_seed(config):
    first, again, other = build_model(config, 1), build_model(config, 1), build_model(config, 2)
    for name, tensor in first.state_dict().items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, again.state_dict()[name]), name
    assert not torch.equal(first.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_saved_checkpoint_reloads_with_identical_logits(tokenizer, config, tmp_path):
    model = build_model(config, 3).eval()
    save_pretrained_model(model, tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 31 + 45?"}], tokenize=False)
    text += "3+1=4 1+5=6 #### 76"
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert reloaded_tokenizer(text, add_special_tokens=False)["input_ids"] == expected
    assert reloaded_tokenizer.decode(expected) == text
    ids = torch.tensor([expected])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    assert next(reloaded.parameters()).dtype == torch.float32
