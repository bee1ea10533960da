"""The models beside the policy (a reference or distillation teacher, `trainer.ref.model.path`; a critic,
`trainer.critic.model.path`) must read and write the policy's tokens: their per-token logprobs or values are taken
at the policy's token ids. A model with another tokenizer is refused before Ray starts, naming the key, with the
first differences."""

from __future__ import annotations

import os

from rl.tasks.jobs import EMBEDDED, EMBEDDED_TEACHER

KEYS = ("trainer.ref.model.path", "trainer.critic.model.path")


def _tokenizer(path: str):
    if path in (EMBEDDED, EMBEDDED_TEACHER):
        from rl.tasks.embedded.tokenizer import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.expanduser(path))


def tokenizer_differences(policy, other, limit: int = 3) -> list[str]:
    """What differs between two tokenizers: vocabulary size, token ids, special tokens (empty when none)."""
    want, got = policy.get_vocab(), other.get_vocab()
    found = []
    if len(want) != len(got):
        found.append(f"{len(got)} tokens against the policy's {len(want)}")
    moved = [token for token, index in want.items() if got.get(token) != index]
    if moved:
        shown = ", ".join(f"{token!r} is {got.get(token)} not {want[token]}" for token in moved[:limit])
        found.append(f"{len(moved)} of the policy's tokens have another id or none ({shown})")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(policy, name, None) != getattr(other, name, None):
            found.append(f"{name} {getattr(other, name, None)} against the policy's {getattr(policy, name, None)}")
    return found


def companion_model_problems(cfg) -> list[str]:
    """One line per companion model whose tokenizer is not the policy's (models that are not at hand are left to
    the path checks)."""
    policy_path = cfg.trainer.policy.model.path
    paths = {"trainer.ref.model.path": cfg.trainer.ref.model.path,
             "trainer.critic.model.path": cfg.trainer.critic.model.path}
    at_hand = {key: path for key, path in paths.items() if path and _local(path) and path != policy_path}
    if not at_hand or not _local(policy_path):
        return []
    policy = _tokenizer(policy_path)
    problems = []
    for key, path in at_hand.items():
        differences = tokenizer_differences(policy, _tokenizer(path))
        if differences:
            problems.append(f"{key}: {path} does not use the policy's tokenizer ({'; '.join(differences)}); its "
                            "per-token scores would be read at the wrong tokens. Use a model trained with "
                            f"{policy_path}'s tokenizer")
    return problems


def _local(path: str) -> bool:
    return path in (EMBEDDED, EMBEDDED_TEACHER) or os.path.isdir(os.path.expanduser(path))
