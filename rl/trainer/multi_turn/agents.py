"""Agents as user code (`environment.agent_fn`): an `async def run(base_url, row, api_key)` plays each episode
against the policy through the OpenAI-compatible endpoint (`agent_endpoint`, which answers only requests with the
run's `api_key`) and returns its reward; the calls it made become the episode's trajectories (`agent_records`),
which train as multi-turn episodes do (the loss on sampled tokens only).

Held to the standard of reward functions and environments: the function is checked before anything starts (it
imports, is async, takes three arguments), the episodes of a batch run side by side, each on a thread and an event
loop of its own (a blocking call stalls only its episode; the endpoint still gathers each turn's calls into one
engine call), each within environment.agent_timeout_s, and an agent that raises, hangs (blocked included: named with
the line it is stuck on), returns no number or a non-finite one is named with its row; data.reward_on_error says
whether that ends the run (`fail`) or scores the episode 0 (`zero`). An agent that tries to end the process
(sys.exit, os._exit, KeyboardInterrupt) ends the run, named, whatever data.reward_on_error says.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from torch import Tensor

from rl.core.data.records import PromptRecord, describe_row
from rl.core.user_code import UserExit, exit_text, exits_as_errors, load_object
from rl.trainer.multi_turn.agent_records import AgentTrajectory, trajectories_of
from rl.trainer.multi_turn.env_calls import EpisodeError
from rl.trainer.multi_turn.turns import trajectory_means
from rl.trainer.rewards.rewarding import SHOWN_ERRORS

KEY = "environment.agent_fn"
SIGNATURE = "async def run(base_url: str, row: dict, api_key: str) -> float | dict"


def load_agent(reference: str) -> Callable:
    """The agent function `reference` names, checked: async, callable with (base_url, row, api_key). Errors name
    the key."""
    agent = load_object(reference, KEY)
    if not inspect.iscoroutinefunction(agent):
        kind = "a class" if inspect.isclass(agent) else f"{type(agent).__name__} {getattr(agent, '__name__', '')}"
        raise ValueError(f"{KEY}: '{reference}' is {kind.strip()}, not an async function; define it as "
                         f"`{SIGNATURE}`")
    try:
        inspect.signature(agent).bind("http://base/v1", {}, "key")
    except TypeError as error:
        raise ValueError(f"{KEY}: '{reference}' cannot be called as run(base_url, row, api_key): {error}; define "
                         f"it as `{SIGNATURE}` (the endpoint answers only requests with the run's key, the openai "
                         "client's api_key)") from None
    return agent


def read_api_key(path: str | None) -> str | None:
    """The endpoint's key from generator.http_endpoint_api_key_file (its first line), None without one."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        key = f.readline().strip()
    if not key:
        raise ValueError(f"generator.http_endpoint_api_key_file: {path} holds no key on its first line")
    return key


def agent_problems(cfg) -> list[str]:
    """Preflight: the agent function loads and has the right shape; a key file holds a key."""
    if cfg.environment.agent_fn is None:
        return []
    problems = []
    try:
        load_agent(cfg.environment.agent_fn)
    except ValueError as error:
        problems.append(str(error))
    try:
        read_api_key(cfg.generator.http_endpoint_api_key_file)
    except OSError as error:
        problems.append(f"generator.http_endpoint_api_key_file: cannot read {error.filename} "
                        f"({error.strerror}); give a readable file whose first line is the key")
    except ValueError as error:
        problems.append(str(error))
    return problems


def row_of(record: PromptRecord) -> dict[str, Any]:
    """The data row as the agent gets it: its other columns, then prompt (text, or a list of chat messages),
    answer, data_source and index."""
    prompt = record.prompt if isinstance(record.prompt, str) else record.messages()
    return {**dict(record.fields), "prompt": prompt, "answer": record.answer, "data_source": record.data_source,
            "index": record.index}


def episode_reward(value: Any) -> tuple[float, dict[str, float]]:
    """(reward, extra numbers) from what an agent returned; ValueError saying what is wrong."""
    extra: dict[str, float] = {}
    if isinstance(value, dict):
        key = "reward" if "reward" in value else "score" if "score" in value else None
        if key is None:
            raise ValueError(f"returned a dict without 'reward' (keys: {sorted(value)})")
        for name, number in value.items():
            if name != key:
                if isinstance(number, bool) or not isinstance(number, int | float):
                    raise ValueError(f"returned {name}={number!r}; extra entries must be numbers")
                extra[name] = float(number)
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"returned {value!r:.80} ({type(value).__name__}); return a number or "
                         "{'reward': number, ...}")
    if not math.isfinite(value):
        raise ValueError(f"returned the reward {value}; rewards must be finite numbers")
    return float(value), extra


ABANDON_GRACE_S = 1.0
"""How long past environment.agent_timeout_s an episode's thread may still run (asyncio's own cancellation at the
deadline ends an agent that awaits) before it is taken to be blocked in a synchronous call and abandoned."""


class _Fatal(Exception):
    """An agent tried to end the process: the run ends whatever data.reward_on_error says."""


class _EpisodeThread:
    """One episode on a daemon thread with its own event loop: its endpoint episode, its result (reward, extra
    numbers, what failed or ""), and its recorded calls once closed."""

    def __init__(self, agents: AgentEpisodes, record: PromptRecord, sample: int, generate, params):
        self.agents, self.record, self.sample = agents, record, sample
        self.episode_id, self.base_url = agents.endpoint.open_episode(generate, params)
        self.result: tuple[float, dict, str] = (0.0, {}, "")
        self.fatal, self.calls, self.closed = False, [], False
        self.done = threading.Event()
        self.deadline: float | None = None
        self.thread = threading.Thread(target=self._play, daemon=True,
                                       name=f"agent {describe_row(record)} sample {sample}")

    def start(self) -> None:
        timeout = self.agents.timeout_s
        self.deadline = None if timeout is None else time.monotonic() + timeout + ABANDON_GRACE_S
        self.thread.start()

    def _play(self) -> None:
        try:
            self.result = asyncio.run(self.agents._call_agent(self.base_url, self.record, self.sample))
        except _Fatal as error:
            self.result, self.fatal = (0.0, {}, str(error)), True
        except BaseException as error:  # whatever ends this thread is the episode's failure
            self.result = (0.0, {}, f"raised {exit_text(error)}")
        finally:
            self.done.set()

    def abandon(self) -> None:
        """Past its deadline and still running: blocked in a synchronous call, which no cancellation reaches."""
        where = blocked_at(self.thread, self.agents.agent)
        self.result = (0.0, {}, f"did not finish within environment.agent_timeout_s={self.agents.timeout_s} s, "
                                f"blocked{where} (a synchronous call in an async agent: use asyncio.sleep and "
                                "async clients, or asyncio.to_thread)")
        self.done.set()
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed, self.calls = True, self.agents.endpoint.close_episode(self.episode_id)

    def error_line(self) -> str:
        """What failed, naming the agent, the row and the sample; "" when the episode succeeded."""
        if not self.result[2]:
            return ""
        where = f"{KEY}={self.agents.reference} on {describe_row(self.record)} (sample {self.sample})"
        return f"{where}: {self.result[2]}" if self.fatal else f"{where} {self.result[2]}"

    def failure_line(self) -> str:
        """The line that ends the run: a fatal exit as it is, another failure with data.reward_on_error's way on."""
        if self.fatal:
            return self.error_line()
        return f"{self.error_line()} (or set data.reward_on_error=zero to score such episodes 0 and go on)"


def blocked_at(thread: threading.Thread, agent: Callable) -> str:
    """" at FILE:LINE in FUNCTION": the innermost line of the agent's own file that `thread` is running, else its
    innermost line; "" when the thread has ended."""
    frame = sys._current_frames().get(thread.ident)
    agent_file = getattr(getattr(agent, "__code__", None), "co_filename", None)
    innermost = frame
    while frame is not None and frame.f_code.co_filename != agent_file:
        frame = frame.f_back
    frame = frame or innermost
    if frame is None:
        return ""
    return f" at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class AgentEpisodes:
    """The run's agent side: the endpoint, the agent function, and `Episodes`' interface (`run`, `rewards`) so
    the loop treats agent episodes as it treats an environment's."""

    def __init__(self, agent: Callable, endpoint, reference: str, on_error: str = "fail",
                 timeout_s: float | None = None):
        self.agent, self.endpoint, self.reference = agent, endpoint, reference
        self.on_error, self.timeout_s = on_error, timeout_s
        self.batches = 0
        self.stopping = threading.Event()

    @classmethod
    def from_config(cls, cfg, tokenizer, model_path: str) -> AgentEpisodes:
        from rl.trainer.multi_turn.agent_endpoint import AgentEndpoint
        from rl.trainer.multi_turn.turns import context_limit

        env, gen = cfg.environment, cfg.generator
        agent = load_agent(env.agent_fn)
        # every episode of a batch at once, two batches at a time (the rollout queue's and the driver's), and a
        # client may hold a second connection while it reuses the first
        episodes = cfg.trainer.train_batch_size * max(gen.n_samples_per_prompt, gen.eval_n_samples_per_prompt)
        served = gen.served_model_name or cfg.trainer.policy.model.path
        endpoint = AgentEndpoint(tokenizer, served, gen.http_endpoint_host, gen.http_endpoint_port,
                                 context_limit(cfg, model_path), gen.max_generate_length,
                                 api_key=read_api_key(gen.http_endpoint_api_key_file),
                                 max_episode_calls=gen.max_turns, max_connections=4 * episodes + 16)
        for name in ("httpx", "httpx2", "openai"):  # one line per request otherwise (httpx2: the openai client's)
            logging.getLogger(name).setLevel(logging.WARNING)
        source = (f"the key in {gen.http_endpoint_api_key_file}" if gen.http_endpoint_api_key_file
                  else "this run's own key, given to the agent function")
        print(f"agent endpoint: {endpoint.bound}/v1 serving {served!r} (episodes at {endpoint.bound}/episodes/<id>/v1;"
              f" answers only requests with {source})", flush=True)
        return cls(agent, endpoint, env.agent_fn, cfg.data.reward_on_error, env.agent_timeout_s)

    def weights_updated(self, version: int) -> None:
        """The policy version of the engines' weights from now on (recorded with each call)."""
        self.endpoint.version = version

    def close(self) -> None:
        """Ends a batch in flight (its episodes abandoned) and the endpoint; once."""
        if not self.stopping.is_set():
            self.stopping.set()
            self.endpoint.close()

    def run(self, generate, records, prompts: list[list[int]], params) -> list[AgentTrajectory]:
        """`params.n` agent episodes per record, side by side; their trajectories, prompt-major. `prompts` (the
        encoded prompts) are not used: an agent writes its own requests."""
        self.batches += 1
        jobs = [(p, s) for p in range(len(records)) for s in range(params.n)]
        episodes = [_EpisodeThread(self, records[p], s, generate, params) for p, s in jobs]
        try:
            self._play_all(episodes)
        finally:
            for episode in episodes:
                episode.close()
            engine_error, self.endpoint.batcher.error = self.endpoint.batcher.error, None
            if engine_error is not None:  # the engine failed, not the agents that saw its 500s
                raise engine_error
        trajectories: list[AgentTrajectory] = []
        failures = []
        for index, ((p, s), episode) in enumerate(zip(jobs, episodes, strict=True)):
            reward, extra, _ = episode.result
            error = episode.error_line()
            if error:
                failures.append(error)
            made = trajectories_of(episode.calls, p, s, index)
            for trajectory in made:
                trajectory.reward, trajectory.metrics, trajectory.error = reward, extra, error
                if error:
                    trajectory.finish_reason = "error"
            trajectories.extend(made)
        self._report(failures, len(jobs))
        if not trajectories:
            raise EpisodeError(f"{KEY}={self.reference}: no agent episode of this batch called the endpoint, so "
                               "there is nothing to train on; the agent must send its requests to the base_url it "
                               "is given")
        return trajectories

    def _play_all(self, episodes: list[_EpisodeThread]) -> None:
        """Every episode at once, each on a thread and an event loop of its own (a blocking call in one stalls no
        other, nor this thread); the engine calls run here while the agents wait for their replies. An episode
        still running past its deadline is abandoned (a thread cannot be stopped) and named with the line it is
        blocked on; with data.reward_on_error=fail the first failed episode ends the batch."""
        batcher = self.endpoint.batcher
        for episode in episodes:
            episode.start()
        while True:
            running = [e for e in episodes if not e.done.is_set()]
            for episode in episodes:
                if episode.done.is_set() and episode.result[2] and (episode.fatal or self.on_error == "fail"):
                    raise EpisodeError(episode.failure_line())
            if not running:
                return
            if self.stopping.is_set():
                raise EpisodeError(f"{KEY}={self.reference}: the run ended while {len(running)} episode(s) played")
            taken = batcher.take(0.1)
            if taken:
                batcher.run(taken)
            now = time.monotonic()
            for episode in running:
                if episode.deadline is not None and now > episode.deadline and not episode.done.is_set():
                    episode.abandon()

    async def _call_agent(self, base_url: str, record: PromptRecord, sample: int) -> tuple[float, dict, str]:
        """(reward, extra numbers, "") or (0, {}, what went wrong)."""
        try:
            value = await asyncio.wait_for(self._guarded(base_url, row_of(record)), self.timeout_s)
            reward, extra = episode_reward(value)
            return reward, extra, ""
        except UserExit as error:  # trying to end the process ends the run, whatever data.reward_on_error says
            raise _Fatal(str(error)) from None
        except TimeoutError:
            return 0.0, {}, (f"did not finish within environment.agent_timeout_s={self.timeout_s} s; make the "
                             "agent faster or raise environment.agent_timeout_s")
        except ValueError as error:
            return 0.0, {}, str(error)
        except Exception as error:
            return 0.0, {}, f"raised {exit_text(error)}"

    async def _guarded(self, base_url: str, row: dict[str, Any]) -> Any:
        """The agent's coroutine with its exits made errors inside it: a SystemExit leaving an asyncio task is
        re-raised by the event loop itself, past any handler outside the task."""
        with exits_as_errors():
            return await self.agent(base_url, row, self.endpoint.api_key)

    @staticmethod
    def _report(failures: list[str], count: int) -> None:
        if failures and len(failures) == count:
            raise EpisodeError(f"all {count} agent episodes of this batch failed, the first: {failures[0]}; "
                               "data.reward_on_error=zero scores a failed episode 0, but a batch with no working "
                               "episode has nothing to train on: fix the agent")
        for line in failures[:SHOWN_ERRORS]:
            print(f"warning: {line}; scored 0 (data.reward_on_error=zero)", flush=True)

    @staticmethod
    def rewards(trajectories: list[AgentTrajectory]) -> tuple[Tensor, dict[str, float]]:
        """[B] rewards (an episode's reward on each of its trajectories), and the means of the calls per
        trajectory, of each way they finished (finish/<reason>) and of the agents' extra numbers (agent/<name>);
        trajectories_per_episode, policy_version (the newest that sampled a token), and reward_errors (failed
        episodes, data.reward_on_error=zero)."""
        rewards, means = trajectory_means(trajectories, [t.calls for t in trajectories], "agent")
        episodes = {(t.prompt_index, t.sample_index) for t in trajectories}
        means["trajectories_per_episode"] = len(trajectories) / max(len(episodes), 1)
        versions = [v for t in trajectories for v in t.versions if v >= 0]
        if versions:  # the newest policy version that sampled a token of this batch
            means["policy_version"] = float(max(versions))
        means["reward_errors"] = float(len({(t.prompt_index, t.sample_index) for t in trajectories if t.error}))
        return rewards, means
