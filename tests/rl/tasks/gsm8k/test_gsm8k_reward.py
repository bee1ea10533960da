"""Hand-written cases for the GSM8K verifier: every phrasing, every number-normalization rule, and failures."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.core.rewards import REWARD_FUNCTIONS
from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)
from rl.tasks.gsm8k.rewards import extract_answer

strict = REWARD_FUNCTIONS.get("gsm8k")
flexible = REWARD_FUNCTIONS.get("gsm8k_flexible")

STRICT_CORRECT = [
    ("#### 72", "72"),
    ("Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72", "72"),
    ("#### 72\n", "72"),
    ("####72", "72"),
    ("#### 1,234", "1234"),
    ("#### 1234", "1,234"),
    ("#### 1,000,000", "1000000"),
    ("#### $18", "18"),
    ("#### €20", "20"),
    ("#### 18 dollars", "18"),
    ("#### 5 apples", "5"),
    ("#### 18.", "18"),
    ("#### 50%", "50"),
    ("#### 3.50", "3.5"),
    ("#### 7/2", "3.5"),
    ("#### 0.5", "1/2"),
    ("#### 2/4", "0.5"),
    ("#### -5", "-5"),
    ("#### −5", "-5"),
    ("#### -$5", "-5"),
    ("#### 4\nOn second thought:\n#### 9", "9"),
    ("#### 10.00", "10"),
]

STRICT_WRONG = [
    ("#### 71", "72"),
    ("#### 720", "72"),
    ("#### 7.2", "72"),
    ("#### -72", "72"),
    ("#### 72\nOn second thought:\n#### 71", "72"),
    ("####", "72"),
    ("#### ", "72"),
    ("72 ####", "72"),
    ("#### seventy-two", "72"),
    ("#### The answer is 72", "72"),
    ("The answer is 72", "72"),
    ("A: 72", "72"),
    ("\\boxed{72}", "72"),
    ("#### 1/3", "0.33"),
    ("#### 0.333333", "1/3"),
    ("", "72"),
]

FLEXIBLE_CORRECT = [
    ("#### 18", "18"),
    ("She makes 9 * 2 = $<<9*2=18>>18 every day.\nA: 18", "18"),
    ("A: $18", "18"),
    ("A:18", "18"),
    ("The answer is 18.", "18"),
    ("The answer is **18**.", "18"),
    ("So the answer is $1,234.", "1234"),
    ("Final answer: 42", "42"),
    ("The final answer is: 42 marbles", "42"),
    ("answer: 7", "7"),
    ("ANSWER = 7", "7"),
    ("The answer would be 7", "7"),
    ("\\boxed{18}", "18"),
    ("The total is $\\boxed{18}$.", "18"),
    ("$\\boxed{\\frac{1}{2}}$", "0.5"),
    ("\\boxed{\\dfrac{3}{6}}", "1/2"),
    ("\\boxed{\\$1{,}234}", "1234"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("\\boxed{25\\%}", "25"),
    ("So she makes 9 * 2 = 18 dollars every day.", "18"),
    ("She has 3 apples and buys 2 more, 5 apples in all", "5"),
    ("It rose by 25%", "25"),
    ("The answer is -3", "-3"),
    ("The answer is −3", "-3"),
    ("The answer is 3.50", "7/2"),
    ("The answer is 2/4", "1/2"),
    ("The answer is 12 dollars. Check: 12 / 4 = 3", "12"),
    ("A: 5\nThat used 7 boxes", "5"),
    ("#### 5\nThe answer is 6", "5"),
    ("\\boxed{5} so the answer is 6", "5"),
    ("The answer is 4. No wait, the answer is 6.", "6"),
    ("Step 1: 16 - 3 - 4 = 9", "9"),
]

FLEXIBLE_WRONG = [
    ("I don't know.", "18"),
    ("", "18"),
    ("The answer is 17", "18"),
    ("A: 18.5", "18"),
    ("A: 17.9999999", "18"),
    ("The answer is 0.333", "1/3"),
    ("#### 5\nThe answer is 6", "6"),
    ("#### \nThe answer is", "18"),
]


@pytest.mark.parametrize(("response", "answer"), STRICT_CORRECT)
def test_strict_accepts(response, answer):
    assert strict(response, answer) == 1.0


@pytest.mark.parametrize(("response", "answer"), STRICT_WRONG)
def test_strict_rejects(response, answer):
    assert strict(response, answer) == 0.0


@pytest.mark.parametrize(("response", "answer"), STRICT_CORRECT + FLEXIBLE_CORRECT)
def test_flexible_accepts(response, answer):
    assert flexible(response, answer) == 1.0


@pytest.mark.parametrize(("response", "answer"), FLEXIBLE_WRONG)
def test_flexible_rejects(response, answer):
    assert flexible(response, answer) == 0.0


@pytest.mark.parametrize(
    ("text", "mode", "expected"),
    [
        ("#### 1,234.50 dollars", "strict", "1234.5"),
        ("#### 72", "strict", "72"),
        ("#### -0.25", "strict", "-0.25"),
        ("#### 2/6", "strict", "1/3"),
        ("#### 7/2", "strict", "3.5"),
        ("The answer is 72", "strict", None),
        ("####", "strict", None),
        ("\\boxed{2/4}", "flexible", "0.5"),
        ("A: 1,080", "flexible", "1080"),
        ("no digits here", "flexible", None),
        ("", "flexible", None),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_extract_answer_defaults_to_strict():
    assert extract_answer("The answer is 3") is None
    assert extract_answer("#### 3") == "3"


def test_extract_answer_names_the_modes_on_a_bad_mode():
    with pytest.raises(KeyError, match="flexible, strict"):
        extract_answer("#### 3", mode="loose")


def test_registry_holds_both_rewards():
    assert {"gsm8k", "gsm8k_flexible"} <= set(REWARD_FUNCTIONS.names())


@pytest.mark.parametrize("reward", [strict, flexible])
@pytest.mark.parametrize(
    ("response", "answer"),
    [
        (None, "18"),
        ("#### 18", None),
        (b"#### 18", "18"),
        ("#### 18", 18),
        ("#### 18", ""),
        ("#### 18", "eighteen"),
        ("#### 1/0", "1"),
        ("#### " + "9" * 6000, "9" * 6000),
        ("#### 5", "1/0"),
    ],
)
def test_malformed_input_scores_zero(reward, response, answer):
    assert reward(response, answer) == 0.0


@settings(max_examples=300, deadline=None, database=None)
@given(response=st.text(), answer=st.text(alphabet="0123456789-.,/$ ", max_size=12))
def test_rewards_never_raise(response, answer):
    assert strict(response, answer) in (0.0, 1.0)
    assert flexible(response, answer) in (0.0, 1.0)


@settings(max_examples=200, deadline=None, database=None)
@given(value=st.integers(min_value=-(10**9), max_value=10**9))
def test_any_integer_with_thousands_separators_matches(value):
    written = f"{value:,}"
    assert strict(f"#### {written}", str(value)) == 1.0
    assert flexible(f"The answer is {written}.", str(value)) == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "The answer is" + " " * 200_000 + "x",
        "A:" + " " * 200_000,
        "\\boxed{" * 50_000,
        "1," * 100_000,
        "answer " * 50_000,
    ],
)
def test_long_adversarial_responses_stay_fast(response):
    start = time.perf_counter()
    assert flexible(response, "5") == 0.0
    assert strict(response, "5") == 0.0
    assert time.perf_counter() - start < 2.0
