"""Prompts as the trainer feeds them to the engine: a record through the tokenizer's chat template (plain text as
it is; a prompt template, data.prompt_template_file / system_prompt_file, made the record a chat when the data
loaded: `rl.core.data.templates`), cut to generator.max_prompt_length as data.truncation says (veRL's key and values).

A cut prompt is named in a warning once per row and counted per step (`prompts_truncated`); `error` refuses it. A
prompt that cannot fit the model's positions with a full response is refused before training
(`prompt_problems`: in `rl.trainer.preflight.checks` where the model's tokenizer is at hand, else when the trainer
starts). A prompt made largely of the tokenizer's unknown token is named in a warning once per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from rl.core.config import ConfigError
from rl.core.data import PromptRecord
from rl.core.data.records import describe_row

UNKNOWN_SHARE_WARNING = 0.05
"""A prompt with a larger share of the tokenizer's unknown token is named in a warning. A constant, not a key: it
only decides a warning. One token in twenty unknown is text the tokenizer does not cover (another script, a
mis-decoded file), while a stray emoji in a long prompt stays below it. Byte-level tokenizers (Qwen's, Llama 3's)
have no unknown token, so nothing is counted for them."""


def render_ids(tokenizer, record: PromptRecord) -> list[int]:
    """The whole prompt's ids: chat messages through the tokenizer's template with the generation prompt."""
    if record.is_chat:
        text = tokenizer.apply_chat_template(list(record.messages()), add_generation_prompt=True, tokenize=False)
    else:
        text = record.prompt
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def truncate(ids: list[int], max_length: int, truncation: str) -> list[int]:
    """`ids` cut to `max_length`: `left` keeps the last tokens, `right` the first, `middle` the first
    max_length // 2 and the last max_length - max_length // 2 (veRL's split). `error` never cuts (checked before)."""
    if len(ids) <= max_length or truncation == "error":
        return ids
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head):]
    return ids[len(ids) - max_length:]


def too_long_message(where: str, length: int, max_length: int) -> str:
    return (f"the prompt of {where} has {length} tokens, more than generator.max_prompt_length={max_length}; raise "
            "generator.max_prompt_length, shorten the prompt, or set data.truncation to left, right or middle to cut "
            "such prompts")


def no_position_room_message(where: str, length: int, cut: bool, generate: int, positions: int) -> str:
    kept = " (cut to generator.max_prompt_length)" if cut else ""
    fixes = [f"lower generator.max_generate_length to {positions - length}"] if positions > length else []
    if positions > generate:
        fixes.append(f"lower generator.max_prompt_length to {positions - generate} (longer prompts are then cut as "
                     "data.truncation says)")
    fixes.append("shorten the prompt")
    return (f"the prompt of {where} has {length} tokens{kept}; with generator.max_generate_length={generate} it needs "
            f"{length + generate} positions, more than the model's max_position_embeddings={positions}; "
            f"{', '.join(fixes[:-1])}{' or ' if len(fixes) > 1 else ''}{fixes[-1]}")


def model_positions(model_path: str) -> int | None:
    """The model's max_position_embeddings (config.json), or None when its config names none."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)


def _position_room(cfg, positions: int | None) -> int | None:
    """Single-turn: the most prompt tokens a full response leaves room for within the model's positions, or None
    when every prompt cut to max_prompt_length fits (multi-turn episodes check their own context:
    `multi_turn.turns.context_limit`)."""
    gen, env = cfg.generator, cfg.environment
    if env.env_class is not None or env.agent_fn is not None or not positions:
        return None
    return positions - gen.max_generate_length if gen.max_prompt_length + gen.max_generate_length > positions else None


def needs_encoding(cfg, positions: int | None) -> bool:
    """Whether `prompt_problems` has anything to check (else the prompts need not be encoded before training)."""
    return cfg.data.truncation == "error" or _position_room(cfg, positions) is not None


def prompt_problems(cfg, tokenizer, datasets: Mapping[str, Iterable[PromptRecord] | None],
                    positions: int | None) -> list[str]:
    """One line per dataset (by its key) per problem, naming the first row at fault and how many are: prompts longer
    than generator.max_prompt_length with data.truncation=error, and single-turn prompts that, cut as the trainer
    cuts them, leave no room for generator.max_generate_length tokens within the model's `positions`."""
    if not needs_encoding(cfg, positions):
        return []
    gen, error = cfg.generator, cfg.data.truncation == "error"
    room = _position_room(cfg, positions)
    found = []
    for key, dataset in datasets.items():
        if dataset is None:
            continue
        records = list(dataset)
        long, no_room = [], []
        for record in records:
            length = len(render_ids(tokenizer, record))
            if error and length > gen.max_prompt_length:
                long.append((record, length))
            elif room is not None and min(length, gen.max_prompt_length) > room:
                no_room.append((record, length))
        if long:
            record, length = long[0]
            message = too_long_message(describe_row(record), length, gen.max_prompt_length)
            found.append(f"data.truncation: {message} ({len(long)} of the {len(records)} prompts of {key} are longer)")
        if no_room:
            record, length = no_room[0]
            kept = min(length, gen.max_prompt_length)
            message = no_position_room_message(describe_row(record), kept, kept < length, gen.max_generate_length,
                                               positions)
            found.append(f"generator.max_prompt_length: {message} ({len(no_room)} of the {len(records)} prompts of "
                         f"{key} leave no room)")
    return found


def checked_before_start(cfg) -> bool:
    """Whether `rl.trainer.preflight.checks` ran `prompt_problems` on every dataset: the model's tokenizer was at hand
    and no dataset is the embedded job's (written when the run starts)."""
    from rl.tasks.jobs import model_at_hand, uses_embedded

    return model_at_hand(cfg.trainer.policy.model.path) and not uses_embedded(cfg)


def refuse_at_start(cfg, tokenizer, datasets: Mapping[str, Iterable[PromptRecord] | None], model_path: str) -> None:
    """`prompt_problems` when the trainer starts, for what the preflight could not check (`checked_before_start`),
    raised as one ConfigError."""
    if checked_before_start(cfg):
        return
    problems = prompt_problems(cfg, tokenizer, datasets, model_positions(model_path))
    if problems:
        raise ConfigError(problems)


class PromptEncoder:
    """Encodes records for the engine (`encode`), remembering which rows were cut (`truncated_count`) and warning
    about each cut or largely unknown row once. `log` prints a warning line. With a vision-language model's
    `processor`, a record's images are prepared with its ids (`rl.trainer.rollout.image_prompts`) and kept for
    `images_of`; such a prompt is never cut."""

    def __init__(self, tokenizer, max_length: int, truncation: str, log: Callable[[str], None] | None = None,
                 processor=None):
        self.tokenizer, self.max_length, self.truncation = tokenizer, max_length, truncation
        self.processor = processor
        self.unk_id = getattr(tokenizer, "unk_token_id", None)
        self.log = log or (lambda line: print(line, flush=True))
        self.truncated: set[tuple] = set()
        self.warned: set[tuple] = set()
        self.images: dict[tuple, object] = {}

    def encode(self, record: PromptRecord) -> list[int]:
        key, where = (record.where, record.data_source, record.index), describe_row(record)
        if self.processor is not None and record.images:
            from rl.trainer.rollout.image_prompts import encode_with_images

            ids, self.images[key] = encode_with_images(self.processor, record)
            if len(ids) > self.max_length:
                raise ConfigError([f"generator.max_prompt_length: {too_long_message(where, len(ids), self.max_length)}"
                                   " (a prompt with images is never cut: its image tokens count)"])
            return ids
        ids = render_ids(self.tokenizer, record)
        if len(ids) > self.max_length:
            if self.truncation == "error":  # refused before training; here for a prompt no check saw
                raise ConfigError([f"data.truncation: {too_long_message(where, len(ids), self.max_length)}"])
            self.truncated.add(key)
            self._warn_once(("cut", key), f"warning: the prompt of {where} has {len(ids)} tokens, more than "
                            f"generator.max_prompt_length={self.max_length}; cut to it (data.truncation="
                            f"{self.truncation})")
            ids = truncate(ids, self.max_length, self.truncation)
        if self.unk_id is not None and ids:
            unknown = sum(1 for token in ids if token == self.unk_id)
            if unknown / len(ids) > UNKNOWN_SHARE_WARNING:
                self._warn_once(("unk", key), f"warning: {unknown} of the {len(ids)} tokens of the prompt of {where} "
                                f"are the tokenizer's unknown token {self.tokenizer.unk_token}, which the model cannot "
                                "read; check the row's text and encoding, or use a tokenizer that covers it")
        return ids

    def encode_all(self, records: Iterable[PromptRecord]) -> list[list[int]]:
        self.images = {}  # only the batch at hand's pixel values are kept
        return [self.encode(record) for record in records]

    def images_of(self, records: Iterable[PromptRecord]) -> list | None:
        """The images each of `records` (encoded by the last `encode_all`) was prepared with, None for one without;
        None when no record has any."""
        found = [self.images.get((r.where, r.data_source, r.index)) if r.images else None for r in records]
        return found if any(entry is not None for entry in found) else None

    def truncated_count(self, records: Iterable[PromptRecord]) -> int:
        """How many of `records` (encoded before) were cut."""
        return sum((r.where, r.data_source, r.index) in self.truncated for r in records)

    def _warn_once(self, key: tuple, line: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.log(line)
