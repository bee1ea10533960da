"""Environments held to the reward functions' standard. Each fault of a user environment (its `__init__`, `start` or
`step` raising, `step` returning something that is no well-formed StepResult, a step past
`environment.step_timeout_s`) ends the episodes with one `EpisodeError` naming the class, the data row and the turn,
or with data.reward_on_error=zero scores that episode 0; a NaN reward is left to trainer.non_finite. The steps of a
turn run side by side (`environment.max_env_workers`). Played on the real "hf" engine over an untrained tiny model.

Through the launcher: what fails every episode (an `__init__` that raises or hangs, a prompt with no room) is refused
before Ray with exit code 2; one run whose step hangs ends in about the deadline with exit code 1 and one line."""

from __future__ import annotations

import math
import re
import textwrap
import threading
import time

import pytest
import torch
from transformers import AutoTokenizer

from rl.core.data import PromptRecord, load_prompt_dataset
from rl.core.environments import Environment, StepResult
from rl.core.generation import SamplingParams, build_engine
from rl.trainer.multi_turn.episodes import Episodes
from rl.trainer.multi_turn.turns import EnvSettings, EpisodeError, run_episodes
from rl.trainer.state.finite import NonFiniteError, non_finite_rewards
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import make_tiny_job, run_train

SEED = 5
ROWS = 3  # prompts per batch
FAIL = EnvSettings(max_workers=4, step_timeout_s=30.0, on_error="fail", reference="faults.py:Env")
ZERO = EnvSettings(max_workers=4, step_timeout_s=30.0, on_error="zero", reference="faults.py:Env")


class Counting(Environment):
    """Two turns: reward 0.25 for the first, 0.5 for the second, the turn count as a metric."""

    def start(self, record: PromptRecord) -> None:
        self.record, self.turn = record, 0

    def step(self, action: str) -> StepResult:
        self.turn += 1
        return StepResult("<|user|>again<|end|><|assistant|>", 0.25 * self.turn, self.turn == 2, {"turn": self.turn})


class InitRaises(Counting):
    def __init__(self):
        raise ValueError("no sandbox available")


class StartRaises(Counting):
    def start(self, record: PromptRecord) -> None:
        raise KeyError("missing column 'tests'")


class SecondStepRaises(Counting):
    def step(self, action: str) -> StepResult:
        if self.turn == 1:
            raise RuntimeError("the judge answered 500")
        return super().step(action)


class ReturnsTuple(Counting):
    def step(self, action: str):
        return ("", 1.0, True)


class ReturnsNone(Counting):
    def step(self, action: str):
        return None


class TextReward(Counting):
    def step(self, action: str) -> StepResult:
        return StepResult("", "1.0", True)


class TextMetric(Counting):
    def step(self, action: str) -> StepResult:
        return StepResult("", 1.0, True, {"quality": "high"})


class NanReward(Counting):
    def step(self, action: str) -> StepResult:
        return StepResult("", math.nan, True)


class Exits(Counting):
    def step(self, action: str) -> StepResult:
        raise SystemExit(0)


class Hangs(Counting):
    """The first row's step sleeps far past any deadline of these tests; the other rows answer at once."""

    def step(self, action: str) -> StepResult:
        if self.record.where.endswith(" row 0"):
            time.sleep(120)
        return StepResult("", 1.0, True)


class FailsOnOddRows(Counting):
    def step(self, action: str) -> StepResult:
        if self.record.index % 2:
            raise ValueError(f"row {self.record.index} is odd")
        return super().step(action)


class Overlap(Counting):
    """Counts how many steps run at once (shared by every instance)."""

    lock = threading.Lock()
    running = 0
    peak = 0

    def step(self, action: str) -> StepResult:
        with Overlap.lock:
            Overlap.running += 1
            Overlap.peak = max(Overlap.peak, Overlap.running)
        time.sleep(0.2)
        with Overlap.lock:
            Overlap.running -= 1
        return super().step(action)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")), seed=SEED)


@pytest.fixture(scope="module")
def setup(job):
    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    engine = build_engine("hf", job.model_path, tokenizer)
    records = list(load_prompt_dataset([job.train_data]))[:ROWS]
    prompt_ids = [
        tokenizer(
            tokenizer.apply_chat_template(r.messages(), add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )["input_ids"]
        for r in records
    ]
    return tokenizer, engine, records, prompt_ids


def play(setup, env_class, settings=FAIL, n=2, max_context_tokens=128):
    """Every token stops a turn, so each turn is one token that ends as "stop" and episodes last as long as their
    environment says."""
    tokenizer, engine, records, prompt_ids = setup
    params = SamplingParams(
        n=n, temperature=1.0, max_new_tokens=4, seed=SEED, stop_token_ids=tuple(range(len(tokenizer)))
    )
    return run_episodes(
        engine.generate, tokenizer, env_class, records, prompt_ids, params, 2, max_context_tokens, settings
    )


def where(setup, row: int) -> str:
    return setup[2][row].where


def test_rows_are_located_by_file_and_row(setup, job):
    assert where(setup, 1) == f"{job.train_data} row 1"


@pytest.mark.parametrize(
    ("env_class", "call", "turn", "problem", "fix"),
    [
        (
            InitRaises,
            "__init__",
            "before the first turn",
            "raised ValueError: no sandbox available (test_environment_faults.py:",
            "fix the class or environment.env_options",
        ),
        (StartRaises, "start", "before the first turn", "raised KeyError: \"missing column 'tests'\"", "fix its start"),
        (SecondStepRaises, "step", "turn 2", "raised RuntimeError: the judge answered 500", "fix its step"),
        (
            ReturnsTuple,
            "step",
            "turn 1",
            "returned tuple ('', 1.0, True), not a StepResult",
            "step must return rl.core.environments.StepResult(observation=str, reward=a number, done=True/False, "
            "metrics={name: number})",
        ),
        (ReturnsNone, "step", "turn 1", "returned None, not a StepResult", "step must return"),
        (
            TextReward,
            "step",
            "turn 1",
            "returned a StepResult whose reward is str '1.0', not a number",
            "step must return",
        ),
        (
            TextMetric,
            "step",
            "turn 1",
            "returned the metric 'quality' = str 'high'; metrics must be finite numbers",
            "step must return",
        ),
    ],
)
def test_each_fault_ends_the_episodes_naming_class_row_and_turn(setup, job, env_class, call, turn, problem, fix):
    with pytest.raises(EpisodeError) as raised:
        play(setup, env_class)
    message = str(raised.value)
    head = re.escape(f"environment.env_class=faults.py:Env: {env_class.__qualname__}.{call} on {job.train_data}")
    assert re.match(rf"{head} row [0-2] \(sample [01], {turn}\) ", message), message
    assert problem in message and fix in message
    assert message.endswith("(or set data.reward_on_error=zero to score such episodes 0 and go on)"), message
    assert "\n" not in message


def test_a_nan_reward_is_left_to_the_non_finite_guard(setup):
    trajectories = play(setup, NanReward)
    rewards, row = Episodes.rewards(trajectories)
    assert bool(torch.isnan(rewards).all()) and row["reward_errors"] == 0.0
    source = "environment.env_class faults.py:Env"
    with pytest.raises(NonFiniteError, match=re.escape(f"{source} gave reward nan on {where(setup, 0)} (6 non-")):
        non_finite_rewards(rewards, trajectories, setup[2], source, "fail")


def test_an_exit_from_a_step_ends_the_run_whatever_reward_on_error_says(setup):
    with pytest.raises(
        EpisodeError,
        match=r"Exits\.step on .* \(sample [01], turn 1\) tried to end the process: "
        r"it called sys\.exit\(0\) \(SystemExit\); user code may not end the run",
    ):
        play(setup, Exits, ZERO)


def test_a_hanging_step_ends_the_episodes_in_about_the_deadline(setup):
    settings = EnvSettings(max_workers=4, step_timeout_s=1.0, on_error="fail", reference="hang.py:Hangs")
    started = time.monotonic()
    with pytest.raises(EpisodeError) as raised:
        play(setup, Hangs, settings)
    assert time.monotonic() - started < 20  # the first turn's generation and one deadline, not 120 s
    assert re.search(
        rf"Hangs\.step on {re.escape(where(setup, 0))} \(sample [01], turn 1\) ran past "
        r"environment\.step_timeout_s=1 s and was abandoned; make step faster or raise "
        r"environment\.step_timeout_s \(or set data\.reward_on_error=zero",
        str(raised.value),
    )


def test_with_reward_on_error_zero_failed_episodes_score_0_and_the_rest_go_on(setup, capsys):
    trajectories = play(setup, FailsOnOddRows, ZERO)
    healthy = play(setup, Counting, ZERO)  # same seed: the same first turns
    for trajectory, reference in zip(trajectories, healthy, strict=True):
        if setup[2][trajectory.prompt_index].index % 2:
            assert (trajectory.reward, trajectory.finish_reason, trajectory.turns) == (0.0, "error", 1)
            assert "FailsOnOddRows.step on" in trajectory.error
            assert "raised ValueError: row 1 is odd" in trajectory.error
        else:
            assert (trajectory.reward, trajectory.turns, trajectory.error) == (0.75, 2, "")
        # The first turn is one engine call for every episode in both runs (later ones hold only those still going).
        assert trajectory.response_ids[:1] == reference.response_ids[:1]
    _, row = Episodes.rewards(trajectories)
    assert row["reward_errors"] == 2.0 and row["finish/error"] == pytest.approx(2 / 6)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and all(line.endswith("; scored 0 (data.reward_on_error=zero)") for line in warnings)


def test_with_reward_on_error_zero_a_hanging_step_is_abandoned(setup):
    settings = EnvSettings(max_workers=2, step_timeout_s=1.0, on_error="zero", reference="hang.py:Hangs")
    started = time.monotonic()
    trajectories = play(setup, Hangs, settings)
    assert time.monotonic() - started < 20
    assert [t.finish_reason == "error" for t in trajectories] == [True, True, False, False, False, False]
    assert [t.reward for t in trajectories] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_a_batch_of_nothing_but_failures_ends_the_run_even_with_zero(setup):
    with pytest.raises(
        EpisodeError,
        match=r"^all 6 episodes of this batch failed, the first: environment\.env_class="
        r"faults\.py:Env: InitRaises\.__init__ on .*nothing to train on",
    ):
        play(setup, InitRaises, ZERO)


def test_steps_of_different_episodes_run_side_by_side_with_the_same_result(setup):
    one_at_a_time = play(setup, Overlap, EnvSettings(max_workers=1))
    assert Overlap.peak == 1
    side_by_side = play(setup, Overlap, EnvSettings(max_workers=6))
    assert Overlap.peak > 1
    for a, b in zip(one_at_a_time, side_by_side, strict=True):
        assert (a.response_ids, a.reward, a.turns, a.metrics) == (b.response_ids, b.reward, b.turns, b.metrics)


def test_a_prompt_without_room_names_its_row_and_lengths(setup):
    length = len(setup[3][0])
    with pytest.raises(
        EpisodeError,
        match=re.escape(
            f"the prompt of {where(setup, 0)} has {length} tokens, leaving "
            f"no room for a response within an episode's {length} tokens"
        ),
    ):
        play(setup, Counting, max_context_tokens=length)


# --- through the launcher -------------------------------------------------------------------------------------------

ENV_FILE = textwrap.dedent("""
    import time

    from rl.core.environments import Environment, StepResult

    class Fine(Environment):
        def start(self, record):
            pass

        def step(self, action):
            return StepResult("", 1.0, True)

    class InitRaises(Fine):
        def __init__(self, level=1):
            raise ValueError(f"level {level} is not installed")

    class InitHangs(Fine):
        def __init__(self):
            time.sleep(120)

    class StepHangs(Fine):
        def step(self, action):
            time.sleep(120)
""")


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "user_env.py"
    path.write_text(ENV_FILE)
    return str(path)


def line_of(text: str) -> int:
    """The line of ENV_FILE holding `text`, as a traceback counts."""
    return next(number for number, line in enumerate(ENV_FILE.splitlines(), 1) if text in line)


def job_overrides(job, env_file: str, env_class: str) -> list[str]:
    return [*job.overrides(steps=2), f"environment.env_class={env_file}:{env_class}"]


@pytest.mark.parametrize(
    ("env_class", "extra", "expected"),
    [
        (
            "InitRaises",
            ["environment.env_options={level: 3}"],
            "environment.env_class: {env}:InitRaises: InitRaises.__init__ (with environment.env_options "
            "{{'level': 3}}) raised ValueError: level 3 is not installed (user_env.py:{line}); fix the class or "
            "environment.env_options",
        ),
        (
            "InitHangs",
            ["environment.step_timeout_s=1"],
            "InitHangs.__init__ (with environment.env_options {{}}) ran past environment.step_timeout_s=1 s and was "
            "abandoned; make __init__ faster or raise environment.step_timeout_s",
        ),
        ("Fine", ["generator.max_input_length=8"], "generator.max_input_length: the prompt of {data} row 0 has "),
    ],
)
def test_what_fails_every_episode_is_refused_before_ray(job, env_file, tmp_path, capsys, env_class, extra, expected):
    printed = launch_refused(str(tmp_path / "run"), [*job_overrides(job, env_file, env_class), *extra], capsys)
    expected = expected.format(env=env_file, data=job.train_data, line=line_of("raise ValueError"))
    assert expected in printed, printed
    if env_class == "Fine":
        assert re.search(
            r"tokens, leaving no room for a response within an episode's 8 tokens of context; .* \(64 of "
            r"the 64 prompts of data\.train_data leave no room\)",
            printed,
        ), printed


def test_a_hanging_step_ends_the_run_in_about_the_deadline_with_one_line(job, env_file, tmp_path):
    from tests.testing.ray_cluster import shared_ray_address

    shared_ray_address()  # the test process's cluster, started before the clock
    started = time.monotonic()
    result = run_train(
        str(tmp_path / "run"), [*job_overrides(job, env_file, "StepHangs"), "environment.step_timeout_s=3"]
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    # After the start (the launcher's "startup: ... (total N s)" line): the first turn's generation, the 3 s deadline
    # and the shutdown, where waiting the step out would take its 120 s.
    start = float(re.search(r"^startup: .*\(total ([\d.]+) s\)$", result.stdout, re.MULTILINE).group(1))
    assert elapsed - start < 60, (elapsed, start)
    lines = [line for line in result.stderr.splitlines() if "StepHangs.step on" in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert re.search(
        rf"environment\.env_class={re.escape(env_file)}:StepHangs: StepHangs\.step on "
        rf"{re.escape(job.train_data)} row \d+ \(sample \d, turn 1\) ran past "
        r"environment\.step_timeout_s=3 s and was abandoned; .* at step 1; no complete checkpoint yet",
        lines[0],
    ), lines[0]
    assert "Traceback" not in result.stderr[-2000:]
