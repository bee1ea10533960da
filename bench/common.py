"""Shared pieces of the benchmarks: a small Qwen2 and a word-level tokenizer built locally, timing and tables.

Nothing here downloads anything: the model is a randomly initialised Qwen2 made from a config, and the tokenizer is
built in code (`build_tokenizer`), so every benchmark runs offline.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import statistics
import string
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|end|>", "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SYMBOLS = (" ", "\n", "####", "+", "-", "*", "=", "?", ".", ",", ":")
WORDS = ("What", "is", "Answer", "the", "answer")
# `<|bos|>` then `<|role|>content<|end|>` per message; the generation prompt is `<|assistant|>`.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelShape:
    """Size of the benchmark's Qwen2 decoder."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    vocab_size: int = 2048
    max_positions: int = 2048

    def describe(self) -> str:
        return (f"Qwen2 hidden={self.hidden} layers={self.layers} heads={self.heads} mlp={self.intermediate} "
                f"vocab={self.vocab_size}")


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer of exactly `vocab_size` tokens with a chat template.

    Special tokens, digits (one token each), a few symbols and words encode arithmetic prompts; the rest of the
    vocabulary is letter-only filler words, so text sampled from a random model holds few digits and rarely ends
    early (the end token is one of `vocab_size`).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
    pieces = [*specials, *string.digits, *SYMBOLS, *WORDS]
    fillers = ("x" + "".join(letters) for size in itertools.count(1)
               for letters in itertools.product(string.ascii_lowercase, repeat=size))
    if vocab_size < len(pieces):
        raise ValueError(f"--vocab_size must be at least {len(pieces)}, got {vocab_size}")
    pieces.extend(itertools.islice(fillers, vocab_size - len(pieces)))
    backend = Tokenizer(models.WordLevel(vocab={p: i for i, p in enumerate(pieces)}, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"####|[A-Za-z]+|\d|[^A-Za-z\d]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(specials))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False, padding_side="left",
    )


def save_model(directory: str, shape: ModelShape, seed: int = 0, with_tokenizer: bool = True) -> str:
    """Writes a randomly initialised fp32 Qwen2 (and the tokenizer) that `from_pretrained(directory)` loads."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        head_dim=shape.hidden // shape.heads, max_position_embeddings=shape.max_positions, tie_word_embeddings=True,
        use_sliding_window=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(directory, safe_serialization=True)
    if with_tokenizer:
        build_tokenizer(shape.vocab_size).save_pretrained(directory)
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_threads(threads: int) -> int:
    """Torch intra-op threads for this process (and what workers read from OMP_NUM_THREADS); 0 means all cores."""
    threads = threads or os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table; floats are shown with 4 significant digits (3 decimals when below 10)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, rule, *body])


def memory_child(cmd: list[str], label: str) -> dict:
    """Runs a benchmark's child process and returns the JSON its last output line holds. A fixed mmap threshold:
    glibc then returns every freed tensor of 128 KiB or more to the OS at once, so the resident-set peak follows
    live tensor memory (as a GPU allocator's peak would) instead of the heap the allocator keeps after activations
    are freed."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)),
               MALLOC_MMAP_THRESHOLD_="131072")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{label} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM: the resident set and its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")
