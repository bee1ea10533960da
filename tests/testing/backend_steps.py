"""One small packed batch and one training step on a built backend, for tests that compare backends or settings."""

from __future__ import annotations

import torch

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import pack_sequences


def write_small_qwen(path: str) -> str:
    """A 2-layer Qwen2 with a 32-token vocabulary and tied embeddings, random from seed 0, saved at `path`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def small_batch():
    """Three packed sequences (6, 9 and 4 tokens), the first two tokens of each outside the loss."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for n in (6, 9, 4):
        mask = torch.arange(n) >= 2
        seqs.append({"input_ids": torch.randint(3, 20, (n,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(n, generator=g) * mask, "old_logprobs": torch.zeros(n)})
    return pack_sequences(seqs)


def oracle_step(model, batch, settings: LossSettings, normalizer: LossNormalizer, trainable: list,
                optimizer: torch.optim.Optimizer) -> float:
    """One policy-loss step of a plain transformers model (the oracle the backends are compared with): logprobs at
    temperature 1, the shared loss, clipping at 1.0, the optimizer's step. Returns the loss."""
    from rl.backends.hf_forward import batch_logprobs
    from rl.core.algorithms import compute_policy_loss

    logprobs, _ = batch_logprobs(model.train(), batch, 1.0, False)
    loss, _ = compute_policy_loss(settings, logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask,
                                  normalizer)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.detach())


def train_step(backend) -> dict[str, float]:
    """Old logprobs from the backend, one GRPO loss without KL over `small_batch`, one optimizer step."""
    batch = small_batch()
    old, _ = backend.logprobs(batch)
    batch = batch.replace(old_logprobs=old)
    settings = LossSettings(use_kl_loss=False)
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
    backend.forward_backward(batch, settings, normalizer)
    return backend.optimizer_step()
