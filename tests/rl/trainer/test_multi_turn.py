"""Multi-turn rollouts on the real "hf" engine over an untrained embedded model: every trajectory must be exactly the
engine's tokens and the environments' encoded observations, in order, with each later turn sampled after exactly
the trajectory so far, within the turn and context limits."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from transformers import AutoTokenizer

import rl.tasks.environments  # noqa: F401  (registers arith_retry)
from rl.core.data import PromptRecord, load_prompt_dataset
from rl.core.environments import Environment, StepResult, make_environment_factory
from rl.core.generation import Rollout, SamplingParams, build_engine
from rl.tasks.embedded import write_untrained_job
from rl.trainer.multi_turn.turns import EpisodeError, Trajectory, run_episodes

DIGITS = tuple("0123456789")
SEED = 11


@dataclass
class Call:
    prompts: list[list[int]]
    params: SamplingParams
    rollouts: list[Rollout]


class RecordingEngine:
    """The real engine's `generate`, keeping every call's prompts, params and rollouts."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[Call] = []

    def __call__(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        rollouts = self.engine.generate(prompts, params)
        self.calls.append(Call([list(p) for p in prompts], params, rollouts))
        return rollouts


class EndlessEnv(Environment):
    """Never ends an episode: answers each turn with a short user turn naming the turn and the action's length."""

    def start(self, record: PromptRecord) -> None:
        self.turn = 0

    def step(self, action: str) -> StepResult:
        self.turn += 1
        observation = f"<|user|>{self.turn} + {len(action)}<|end|><|assistant|>"
        return StepResult(observation, 0.25, False, {"turn": float(self.turn)})


class Recorded(Environment):
    """Runs another environment and keeps its record, the actions it saw and what it answered."""

    def __init__(self, inner: Environment):
        self.inner = inner
        self.record: PromptRecord | None = None
        self.actions: list[str] = []
        self.results: list[StepResult] = []

    def start(self, record: PromptRecord) -> None:
        self.record = record
        self.inner.start(record)

    def step(self, action: str) -> StepResult:
        self.actions.append(action)
        self.results.append(self.inner.step(action))
        return self.results[-1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    job = write_untrained_job(tmp_path_factory.mktemp("job"), seed=SEED, n_train=8, n_val=8)
    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    engine = build_engine("hf", str(job.model_path), tokenizer)
    records = list(load_prompt_dataset([job.train_data]))[:4]
    prompt_ids = [
        tokenizer(tokenizer.apply_chat_template(r.messages(), add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
        for r in records
    ]
    return tokenizer, engine, records, prompt_ids


def run(setup, make_inner, n: int, max_turns: int, max_context_tokens: int, max_new_tokens: int = 6):
    tokenizer, engine, records, prompt_ids = setup
    spy, environments = RecordingEngine(engine), []

    def make_env() -> Environment:
        environments.append(Recorded(make_inner()))
        return environments[-1]

    # Stopping on digits as well as <|end|> keeps an untrained model's turns short, so episodes last several turns.
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new_tokens, seed=SEED,
                            stop_token_ids=tuple(tokenizer.convert_tokens_to_ids(list(DIGITS))))
    trajectories = run_episodes(spy, tokenizer, make_env, records, prompt_ids, params, max_turns, max_context_tokens)
    check_against_engine(trajectories, spy.calls, environments, setup, params, max_context_tokens)
    return trajectories, spy.calls, environments


def check_against_engine(trajectories: list[Trajectory], calls: list[Call], environments: list[Recorded], setup,
                         params: SamplingParams, limit: int) -> None:
    tokenizer, _, records, prompt_ids = setup
    n = params.n
    # Prompt-major, n samples each, one environment per episode started on its own row.
    assert [(t.prompt_index, t.sample_index) for t in trajectories] == [(p, s) for p in range(len(records))
                                                                         for s in range(n)]
    assert len(environments) == len(trajectories)
    assert calls[0].prompts == prompt_ids and calls[0].params.n == n and calls[0].params.seed == SEED
    assert len(calls) == max(t.turns for t in trajectories)
    for turn, call in enumerate(calls[1:], start=1):
        assert call.params.n == 1 and call.params.seed == SEED + turn
        assert len(call.rollouts) == sum(t.turns > turn for t in trajectories)
    for call in calls:
        assert all(len(prompt) + call.params.max_new_tokens <= limit for prompt in call.prompts)
        for rollout in call.rollouts:
            prompt = call.prompts[rollout.prompt_index]
            assert len(prompt) + len(rollout.response_ids) <= limit

    for index, (trajectory, environment) in enumerate(zip(trajectories, environments, strict=True)):
        assert trajectory.prompt_ids == prompt_ids[trajectory.prompt_index]
        assert environment.record == records[trajectory.prompt_index]
        assert len(trajectory.response_mask) == len(trajectory.rollout_logprobs) == len(trajectory.response_ids)
        assert trajectory.context_length <= limit
        position = 0
        for turn in range(trajectory.turns):
            if turn == 0:
                rollout = calls[0].rollouts[index]
                assert (rollout.prompt_index, rollout.sample_index) == (trajectory.prompt_index,
                                                                        trajectory.sample_index)
            else:
                # Later calls list the still-active episodes in trajectory order.
                slot = [i for i, t in enumerate(trajectories) if t.turns > turn].index(index)
                rollout = calls[turn].rollouts[slot]
                assert calls[turn].prompts[slot] == trajectory.prompt_ids + trajectory.response_ids[:position]
            end = position + len(rollout.response_ids)
            assert trajectory.response_ids[position:end] == rollout.response_ids
            assert trajectory.response_mask[position:end] == [True] * len(rollout.response_ids)
            assert trajectory.rollout_logprobs[position:end] == rollout.rollout_logprobs
            action = tokenizer.decode(rollout.response_ids, skip_special_tokens=True)
            assert environment.actions[turn] == action
            position = end
            if turn < trajectory.turns - 1:
                observation = tokenizer.encode(environment.results[turn].observation, add_special_tokens=False)
                end = position + len(observation)
                assert trajectory.response_ids[position:end] == observation
                assert trajectory.response_mask[position:end] == [False] * len(observation)
                assert trajectory.rollout_logprobs[position:end] == [0.0] * len(observation)
                position = end
        assert position == len(trajectory.response_ids)  # no observation after the last turn
        if trajectory.finish_reason == "length":
            assert len(rollout.response_ids) == params.max_new_tokens and rollout.finish_reason == "length"
        if trajectory.finish_reason == "context":
            unsent = tokenizer.encode(environment.results[-1].observation, add_special_tokens=False)
            cut = rollout.finish_reason == "length" and len(rollout.response_ids) < params.max_new_tokens
            assert cut or trajectory.context_length + len(unsent) + 1 > limit
        assert len(environment.actions) == trajectory.turns
        assert trajectory.response_text == environment.actions[-1]
        assert trajectory.reward == pytest.approx(sum(r.reward for r in environment.results))
        assert trajectory.metrics == environment.results[-1].metrics


def test_endless_episodes_run_to_max_turns(setup):
    trajectories, calls, _ = run(setup, EndlessEnv, n=2, max_turns=3, max_context_tokens=128)
    assert len(calls) == 3
    assert {t.finish_reason for t in trajectories} <= {"max_turns", "length"}
    assert any(t.finish_reason == "max_turns" for t in trajectories)
    for trajectory in trajectories:
        # A turn cut by max_new_tokens ends its episode as "length" (checked against the engine), even the last one.
        assert 1 <= trajectory.turns <= 3
        assert trajectory.turns == 3 or trajectory.finish_reason == "length"
        assert trajectory.reward == pytest.approx(0.25 * trajectory.turns)
        assert trajectory.metrics == {"turn": float(trajectory.turns)}


def test_context_limit_is_never_exceeded(setup):
    limit = max(len(p) for p in setup[3]) + 14
    trajectories, calls, _ = run(setup, EndlessEnv, n=2, max_turns=10, max_context_tokens=limit)
    assert {t.finish_reason for t in trajectories} <= {"context", "length"}
    assert any(t.finish_reason == "context" for t in trajectories)
    assert any(call.params.max_new_tokens < 6 for call in calls)  # the cap shrank to the room left
    assert all(t.context_length <= limit for t in trajectories)


def test_arith_retry_asks_again_after_a_wrong_answer(setup):
    make_retry = make_environment_factory("arith_retry", "environment.name")
    trajectories, _, environments = run(setup, make_retry, n=2, max_turns=3, max_context_tokens=128)
    assert any(t.turns == 2 for t in trajectories)
    for trajectory, environment in zip(trajectories, environments, strict=True):
        assert trajectory.reward in (0.0, 0.5, 1.0)
        assert trajectory.metrics["attempts"] == trajectory.turns <= 2
        if trajectory.turns == 2:
            question = environment.record.messages()[-1]["content"]
            assert environment.results[0].observation == f"<|user|>{question}<|end|><|assistant|>"
            assert trajectory.finish_reason in ("stop", "length")
        if trajectory.finish_reason == "stop":
            assert trajectory.metrics["solved"] == 1.0 or trajectory.turns == 2


def test_a_rows_env_class_plays_its_episodes_in_place_of_the_runs(setup):
    """SkyRL's rule: a row's env_class picks its environment; rows without one play in the run's (EndlessEnv)."""
    import dataclasses

    from rl.tasks.gsm8k.skyrl_grading import skyrl_score
    from rl.trainer.multi_turn.row_environments import row_environment_factory
    from rl.trainer.multi_turn.turns import EnvSettings

    tokenizer, engine, records, prompt_ids = setup
    tagged = [dataclasses.replace(r, env_class="gsm8k" if i % 2 else None) for i, r in enumerate(records)]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=SEED,
                            stop_token_ids=tuple(tokenizer.convert_tokens_to_ids(list(DIGITS))))
    settings = EnvSettings(reference="endless", row_environment=row_environment_factory())
    trajectories = run_episodes(engine.generate, tokenizer, EndlessEnv, tagged, prompt_ids, params, 3, 128, settings)
    for trajectory in trajectories:
        record = tagged[trajectory.prompt_index]
        if record.env_class == "gsm8k":  # SkyRL-gym's single-turn gsm8k: one graded turn
            assert (trajectory.turns, trajectory.finish_reason) == (1, "stop")
            assert trajectory.reward == skyrl_score(trajectory.response_text, record.answer)
        else:
            assert trajectory.reward == pytest.approx(0.25 * trajectory.turns)
            assert trajectory.turns == 3 or trajectory.finish_reason == "length"


def test_prompts_without_room_and_bad_turn_limits_are_refused(setup):
    tokenizer, engine, records, prompt_ids = setup
    params = SamplingParams(max_new_tokens=4)
    with pytest.raises(EpisodeError, match=rf"the prompt of {re.escape(records[0].where)} has .* no room"):
        run_episodes(engine.generate, tokenizer, EndlessEnv, records, prompt_ids, params, 2, len(prompt_ids[0]))
    with pytest.raises(ValueError, match="max_turns must be"):
        run_episodes(engine.generate, tokenizer, EndlessEnv, records, prompt_ids, params, 0, 128)


def test_the_training_batch_holds_exactly_the_episode_tokens_with_loss_on_policy_turns(setup):
    import torch

    from rl.trainer.experience import build_experience

    trajectories, calls, _ = run(setup, EndlessEnv, n=2, max_turns=3, max_context_tokens=128)
    rewards = torch.tensor([t.reward for t in trajectories])
    experience = build_experience(trajectories, rewards, "grpo", True)
    for trajectory, sequence in zip(trajectories, experience.sequences, strict=True):
        prompt = len(trajectory.prompt_ids)
        assert sequence["input_ids"].tolist() == trajectory.prompt_ids + trajectory.response_ids
        assert sequence["loss_mask"].tolist() == [False] * prompt + trajectory.response_mask
        assert sequence["rollout_logprobs"][prompt:].tolist() == pytest.approx(trajectory.rollout_logprobs)
        assert any(trajectory.response_mask) and not all(trajectory.response_mask)  # observations carry no loss
    # every loss token is one the engine sampled: the policy tokens, turn after turn, are the engine's outputs
    sampled = sorted(len(r.response_ids) for call in calls for r in call.rollouts)
    assert sum(sampled) == sum(int(s["loss_mask"].sum()) for s in experience.sequences)
