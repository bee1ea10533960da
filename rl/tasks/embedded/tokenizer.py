"""The embedded default's tokenizer: a fixed word-level vocabulary built in code, so no hub download is needed.

Every digit is its own token (arithmetic reads and writes numbers digit by digit), `####` is one token, and the
words of the synthetic task's prompts are single tokens; any other character or word encodes as `<|unk|>`.
Decoding concatenates tokens unchanged, so `decode(encode(text)) == text` for text made of vocabulary pieces.

Chat format (`CHAT_TEMPLATE`): `<|bos|>` then, per message, `<|role|>content<|end|>`; the generation prompt is
`<|assistant|>` and a finished assistant turn ends with `<|end|>`, the eos token.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|end|>", "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
ANSWER_MARKER = "####"
DIGITS = tuple("0123456789")
SYMBOLS = (" ", "\n", ANSWER_MARKER, "+", "-", "*", "=", "?", ".", ",", ":")
WORDS = ("What", "is", "Answer", "after")
# One piece per token: the answer marker, a word, a single digit, or any other single character.
PIECE_PATTERN = r"####|[A-Za-z]+|\d|[^A-Za-z\d]"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
MODEL_MAX_LENGTH = 128


def vocabulary(specials: tuple[str, ...] = (), words: tuple[str, ...] = ()) -> dict[str, int]:
    """Token -> id; special tokens take the first ids (pad is 0), then `specials`, the digits, symbols, the
    embedded words and `words` (a vocabulary grown for another task keeps every embedded id)."""
    pieces = (*SPECIAL_TOKENS, *specials, *DIGITS, *SYMBOLS, *WORDS, *words)
    if len(set(pieces)) != len(pieces):
        raise ValueError("the embedded vocabulary lists a token twice; each piece must appear once")
    return {piece: token_id for token_id, piece in enumerate(pieces)}


def build_tokenizer(specials: tuple[str, ...] = (), words: tuple[str, ...] = (),
                    chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """The embedded tokenizer: left padding (for batched generation), chat template, pad/bos/eos/unk set; with
    `specials`, `words` and `chat_template`, the same grown for another task (`rl.tasks.embedded_vl`)."""
    backend = Tokenizer(models.WordLevel(vocab=vocabulary(specials, words), unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([*SPECIAL_TOKENS, *specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
    )
