"""A critic (value model) from a Hugging Face causal LM: the LM head replaced by one output per token.

The critic is the same module tree as the policy with `lm_head` a `Linear(hidden, 1)`, so every strategy wraps,
shards, checkpoints and runs it through the same code as the policy; `hf_forward.batch_values` reads its output.
Its Hugging Face form is transformers' `<Model>ForTokenClassification` with one label (`score.*`): what an export
writes and what `trainer.critic.model.path` may point at to start from a trained critic.

A new head is drawn from a fixed seed, normal with std 1/(hidden + 1) (OpenRLHF's and SkyRL's initialisation) and
zero bias, so every strategy and every rank starts from the same critic.
"""

from __future__ import annotations

import glob
import os

import torch
from torch import Tensor, nn

HEAD_SEED = 1234
HF_HEAD = "score"  # transformers' token-classification head
OWN_HEAD = "lm_head"  # where the value head sits in the module tree


def saved_head(path: str) -> dict[str, Tensor] | None:
    """`score.weight`/`score.bias` of a token-classification checkpoint with one label at `path`, or None."""
    from safetensors import safe_open

    found: dict[str, Tensor] = {}
    for file in sorted(glob.glob(os.path.join(os.path.expanduser(path), "*.safetensors"))):
        with safe_open(file, framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (a safetensors reader, not a dict)
                if name.startswith(f"{HF_HEAD}."):
                    found[name.removeprefix(f"{HF_HEAD}.")] = reader.get_tensor(name)
    if not found:
        return None
    if found["weight"].shape[0] != 1:
        raise ValueError(f"trainer.critic.model.path: {path} holds a classification head with "
                         f"{found['weight'].shape[0]} labels; a critic has one output (num_labels=1)")
    return found


def new_head(hidden: int) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(HEAD_SEED)
    return {"weight": torch.randn(1, hidden, generator=generator) / (hidden + 1), "bias": torch.zeros(1)}


def attach_value_head(model: nn.Module, path: str) -> None:
    """Replaces `model`'s LM head with the value head: the one saved at `path` when it is a critic's checkpoint,
    else a new one; untied from the input embeddings."""
    weights = saved_head(path) or new_head(model.config.hidden_size)
    head = nn.Linear(model.config.hidden_size, 1, bias=True, device=model.get_input_embeddings().weight.device)
    with torch.no_grad():
        head.weight.copy_(weights["weight"])
        head.bias.copy_(weights.get("bias", torch.zeros(1)))
    model.set_output_embeddings(head)
    model.config.tie_word_embeddings = False


def hf_critic_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A critic's full state under its Hugging Face token-classification names."""
    prefix = f"{OWN_HEAD}."
    return {(HF_HEAD + "." + name.removeprefix(prefix) if name.startswith(prefix) else name): tensor
            for name, tensor in state.items()}


def critic_config(model_path: str):
    """The policy model's config as a one-label token classifier (`AutoModelForTokenClassification` loads it)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    causal = (config.architectures or [type(config).__name__.removesuffix("Config") + "ForCausalLM"])[0]
    config.architectures = [causal.replace("ForCausalLM", "ForTokenClassification")]
    config.num_labels, config.classifier_dropout, config.tie_word_embeddings = 1, 0.0, False
    return config
