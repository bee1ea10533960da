"""The LLM judge: score parsing and template/pattern checks by hand, and JudgeReward over the real "hf" engine with a
tiny random Llama, checked against rendering, encoding and greedy generation done directly with the same engine."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from rl.core.generation import GenerationEngine, HFGenerationEngine, Rollout, SamplingParams
from rl.core.rewards.judge import JudgeReward, check_pattern, check_template, parse_score
from rl.tasks.embedded.model import build_model, tiny_model_config
from rl.tasks.embedded.tokenizer import build_tokenizer

TEMPLATE = "What is {prompt}? Answer: {response} after {answer}. Answer:"
PATTERN = r"(\d)"
PROMPTS = ["2 + 3", "12 * 4", "7", "100 - 1", "9 + 9", "3"]
RESPONSES = ["5", "48", "7", "99", "17", "1"]
ANSWERS = ["5", "48", "7", "99", "18", "3"]
MAX_NEW_TOKENS = 8


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Score: 3. On reflection, Score: 7", 7.0),  # the last match wins
        ("Score: 4.5", 4.5),
        ("Score: -2", -2.0),
        ("no grade here", None),
        ("Score: abc", None),  # matches, but the group is not a number
        ("Score: nan", None),  # a number to float(), but no usable score
        ("", None),
    ],
)
def test_parse_score(text, expected):
    assert parse_score(text, r"Score: (\S+)") == expected


def test_parse_score_reads_the_first_group_only():
    assert parse_score("7/10", r"(\d+)/(\d+)") == 7.0
    assert parse_score("grade: B", r"grade: (\d)?") is None  # the group did not take part in the match


def test_check_template_accepts_the_judge_fields():
    check_template("Q: {prompt}\nA: {response}\nRef: {answer} {{literal}}", "judge.template")
    check_template("{response}", "judge.template")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{prompt} {reply}", r"unknown placeholder \{reply\}.*\{prompt\}, \{response\}, \{answer\}"),
        ("{response} {}", r"unknown placeholder \{\}"),
        ("{response.upper}", r"unknown placeholder \{response.upper\}"),
        ("{prompt} {answer}", r"no \{response\} placeholder"),
        ('{response} as {"score": 1}', r'unknown placeholder \{"score"\}.*literal braces'),
        ("{response", "not a valid format string"),
    ],
)
def test_check_template_refusals(template, message):
    with pytest.raises(ValueError, match=message) as error:
        check_template(template, "judge.template")
    assert str(error.value).startswith("judge.template:")


@pytest.mark.parametrize(
    ("pattern", "message"), [("Score: (\\d", "not a valid regular expression"), (r"Score: \d+", "no capture group")]
)
def test_check_pattern_refusals(pattern, message):
    check_pattern(r"Score: (?P<score>\d+)", "judge.pattern")
    with pytest.raises(ValueError, match=message) as error:
        check_pattern(pattern, "judge.pattern")
    assert str(error.value).startswith("judge.pattern:")


class CountingEngine(GenerationEngine):
    """A real engine, with the `generate` calls it receives recorded."""

    def __init__(self, inner: GenerationEngine):
        self.inner = inner
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        self.calls.append((prompts, params))
        return self.inner.generate(prompts, params)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.update_weights(named_tensors)

    def offload(self) -> None:
        self.inner.offload()

    def reload(self) -> None:
        self.inner.reload()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def engine(tokenizer) -> HFGenerationEngine:
    config = tiny_model_config(tokenizer)
    config.initializer_range = 0.3  # peaked next-token distributions, so greedy replies vary between rows
    return HFGenerationEngine(build_model(config, seed=0).eval(), tokenizer)


def direct_scores(engine: GenerationEngine, tokenizer, chat: bool) -> list[float | None]:
    """The oracle: each row rendered and encoded by hand, generated greedily on its own, its reply parsed."""
    scores = []
    for prompt, response, answer in zip(PROMPTS, RESPONSES, ANSWERS, strict=True):
        text = TEMPLATE.replace("{prompt}", prompt).replace("{response}", response).replace("{answer}", answer)
        if chat:
            messages = [{"role": "user", "content": text}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        [rollout] = engine.generate([ids], SamplingParams(n=1, temperature=0.0, max_new_tokens=MAX_NEW_TOKENS))
        scores.append(parse_score(rollout.response_text, PATTERN))
    return scores


@pytest.mark.parametrize("use_chat_template", [None, False])
def test_judge_scores_equal_the_engine_called_directly(engine, tokenizer, use_chat_template):
    counting = CountingEngine(engine)
    judge = JudgeReward(counting, tokenizer, TEMPLATE, PATTERN, MAX_NEW_TOKENS, use_chat_template=use_chat_template)
    scores = judge.score(PROMPTS, RESPONSES, ANSWERS)

    chat = use_chat_template is None  # the embedded tokenizer has a chat template, so None uses it
    assert scores == direct_scores(engine, tokenizer, chat)
    assert any(score is not None for score in scores)
    [(prompts, params)] = counting.calls  # one greedy call for the whole batch
    assert len(prompts) == len(PROMPTS)
    assert params.greedy and params.n == 1 and params.max_new_tokens == MAX_NEW_TOKENS
    assert prompts[0][0] == (tokenizer.bos_token_id if chat else tokenizer.convert_tokens_to_ids("What"))


def test_judge_refusals(engine, tokenizer):
    with pytest.raises(ValueError, match="unknown placeholder"):
        JudgeReward(engine, tokenizer, "{response} {grade}", PATTERN)
    with pytest.raises(ValueError, match="no capture group"):
        JudgeReward(engine, tokenizer, TEMPLATE, r"\d")
    plain = build_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        JudgeReward(engine, plain, TEMPLATE, PATTERN, use_chat_template=True)
    judge = JudgeReward(engine, tokenizer, TEMPLATE, PATTERN)
    with pytest.raises(ValueError, match="2 prompts, 1 responses and 2 answers"):
        judge.score(["a", "b"], ["c"], ["d", "e"])
    assert judge.score([], [], []) == []
