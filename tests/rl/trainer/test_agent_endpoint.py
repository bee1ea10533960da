"""The agent endpoint without a trainer: the example agent (the real `openai` client over HTTP on localhost) plays
episodes against a scripted engine, and the trajectories are checked token for token against what the engine
sampled and the chat markers written out by hand; bad agents, requests and ports are refused by name."""

from __future__ import annotations

import asyncio
import math
import re
import socket
import time

import httpx
import openai
import pytest

from rl.core.data.records import ChatMessage, PromptRecord
from rl.core.generation.engine import SamplingParams
from rl.tasks.embedded.tokenizer import build_tokenizer
from rl.trainer.multi_turn.agent_endpoint import AgentEndpoint
from rl.trainer.multi_turn.agents import AgentEpisodes, load_agent
from rl.trainer.multi_turn.env_calls import EpisodeError
from tests.testing.scripted_engine import ScriptedEngine, bearer

AGENT = "examples/agents/arith_agent.py:run"
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def endpoint(tokenizer):
    server = AgentEndpoint(tokenizer, "/models/tiny", "127.0.0.1", 0, max_context_tokens=64, max_new_tokens=12)
    yield server
    server.close()


def record(left: int, right: int, index: int = 0) -> PromptRecord:
    return PromptRecord((ChatMessage("user", f"What is {left} + {right}?"),), str(left + right), "embedded", index,
                        where=f"train.jsonl row {index}")


def agents(endpoint, reference=AGENT, **options) -> AgentEpisodes:
    return AgentEpisodes(load_agent(reference), endpoint, reference, **options)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_example_agent_trains_on_exactly_the_sampled_tokens(tokenizer, endpoint, monkeypatch):
    # the batches below are the ones a flush on "every open episode has a request waiting" makes; the linger (a
    # fallback for an episode busy elsewhere) is long enough here that a loaded machine does not flush early
    monkeypatch.setattr(endpoint.batcher, "linger_s", 30.0)
    engine = ScriptedEngine(tokenizer)
    episodes = agents(endpoint)
    episodes.weights_updated(7)
    records = [record(12, 30, 0), record(5, 9, 1)]
    trajectories = episodes.run(engine, records, [[], []], PARAMS)
    assert [(t.prompt_index, t.sample_index) for t in trajectories] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    sampled = {}  # the engine's output for each (question, attempt)
    for prompts, params, rollouts in engine.calls:
        assert params.n == 1 and params.temperature == 1.0 and params.max_new_tokens <= 12
        for prompt, rollout in zip(prompts, rollouts, strict=True):
            text = tokenizer.decode(prompt, skip_special_tokens=False)
            sampled[(re.findall(r"What is [^?]*\?", text)[0], text.count("<|assistant|>"))] = rollout.response_ids
    for t in trajectories:
        question = f"What is {records[t.prompt_index].prompt[0].content[8:]}"
        # written out by hand from the embedded chat format: <|bos|><|user|>q<|end|><|assistant|>
        assert t.prompt_ids == encode(tokenizer, f"<|bos|><|user|>{question}<|end|><|assistant|>")
        retry = encode(tokenizer, f"<|user|>{question}<|end|><|assistant|>")
        first, second = sampled[(question, 1)], sampled[(question, 2)]
        assert t.response_ids == first + retry + second
        assert t.response_mask == [True] * len(first) + [False] * len(retry) + [True] * len(second)
        expected_lp = [-0.1 * (k + 1) for k in range(len(first))] + [0.0] * len(retry) + \
                      [-0.1 * (k + 1) for k in range(len(second))]
        assert t.rollout_logprobs == pytest.approx(expected_lp)
        assert t.versions == [7] * len(first) + [-1] * len(retry) + [7] * len(second)
        assert (t.reward, t.calls, t.finish_reason) == (0.5, 2, "stop")
        assert t.metrics == {"solved": 1.0, "attempts": 2.0}
    rewards, row = episodes.rewards(trajectories)
    assert rewards.tolist() == [0.5] * 4
    assert row["agent/attempts"] == 2.0 and row["trajectories_per_episode"] == 1.0 and row["reward_errors"] == 0
    # batching: the first attempts of all four episodes went in one engine call, the second ones in another
    assert [len(prompts) for prompts, _, _ in engine.calls] == [4, 4]


async def rewriting_agent(base_url: str, row: dict, api_key: str) -> float:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    question = row["prompt"][0]["content"]
    first = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": question}])
    # a history the first reply does not continue: a new trajectory of the same episode
    await client.chat.completions.create(model="tiny", messages=[
        {"role": "user", "content": question}, {"role": "assistant", "content": "#### 1"},
        {"role": "user", "content": question}])
    await client.close()
    return 0.25 if first.choices[0].message.content else 0.0


def test_a_rewritten_history_becomes_a_second_trajectory_sharing_the_reward(tokenizer, endpoint, monkeypatch):
    import rl.trainer.multi_turn.agents as agents_module

    monkeypatch.setattr(agents_module, "load_object", lambda reference, key: rewriting_agent)
    engine = ScriptedEngine(tokenizer)
    trajectories = agents(endpoint, "tests:rewriting_agent").run(engine, [record(1, 2)], [[]],
                                                                 SamplingParams(n=1, max_new_tokens=12))
    assert len(trajectories) == 2 and [t.reward for t in trajectories] == [0.25, 0.25]
    whole = encode(tokenizer, "<|bos|><|user|>What is 1 + 2?<|end|><|assistant|>#### 1<|end|>"
                              "<|user|>What is 1 + 2?<|end|><|assistant|>")
    assert trajectories[1].prompt_ids == whole  # re-templated: the agent's text, not the sampled tokens
    assert trajectories[1].response_ids == engine.calls[1][2][0].response_ids


def test_bad_requests_get_openai_errors(tokenizer):
    import threading

    endpoint = AgentEndpoint(tokenizer, "/models/tiny", "127.0.0.1", 0, max_context_tokens=64, max_new_tokens=12)
    threading.Thread(target=endpoint.batcher.serve_forever, daemon=True).start()  # no AgentEpisodes.run here
    episode_id, base_url = endpoint.open_episode(ScriptedEngine(tokenizer), SamplingParams(max_new_tokens=12))
    client = openai.OpenAI(base_url=base_url, api_key=endpoint.api_key, max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError, match="the model 'gpt-4' does not exist; this endpoint serves "
                                                       "'/models/tiny'"):
            client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "What is 1 + 1?"}])
        long = "What is 1 + 1? " * 20
        with pytest.raises(openai.BadRequestError, match=re.escape("leaving no room for a reply within "
                                                                   "generator.max_input_length=64")):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}])
        assert [m.id for m in client.models.list().data] == ["/models/tiny"]
        # plain HTTP, a completion given as text, then continued
        reply = httpx.post(f"{base_url}/completions", json={"model": "tiny", "prompt": "What is 2 + 2?"},
                           headers=bearer(endpoint.api_key)).json()
        assert reply["choices"][0]["text"] == "#### 0" and reply["object"] == "text_completion"
        httpx.post(f"{base_url}/completions", json={"prompt": "What is 2 + 2?#### 0<|end|>What is 2 + 2?"},
                   headers=bearer(endpoint.api_key))
    finally:
        client.close()
    calls = endpoint.close_episode(episode_id)
    assert len(calls) == 2 and calls[1].extends
    assert calls[1].prompt_ids == calls[0].prompt_ids + calls[0].response_ids + encode(tokenizer, "What is 2 + 2?")
    gone = httpx.post(f"{base_url}/chat/completions", json={"messages": [{"role": "user", "content": "1"}]},
                      headers=bearer(endpoint.api_key))
    assert gone.status_code == 404 and "no open episode" in gone.json()["error"]["message"]
    endpoint.close()


def test_streamed_replies_are_the_recorded_calls(tokenizer):
    """`stream=true` (chat and text completions, the `openai` client's iterators): the chunks join to the reply the
    episode recorded, the last carries the finish reason, and include_usage adds the token counts."""
    import threading

    endpoint = AgentEndpoint(tokenizer, "/models/tiny", "127.0.0.1", 0, max_context_tokens=64, max_new_tokens=12)
    threading.Thread(target=endpoint.batcher.serve_forever, daemon=True).start()
    episode_id, base_url = endpoint.open_episode(ScriptedEngine(tokenizer), SamplingParams(max_new_tokens=12))
    client = openai.OpenAI(base_url=base_url, api_key=endpoint.api_key, max_retries=0)
    try:
        chunks = list(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "What is 2 + 3?"}], stream=True,
            stream_options={"include_usage": True}))
        texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert "".join(texts) == "#### 0" and len(texts) > 2  # a piece per token
        assert finishes[-1] == "stop" and not any(finishes[:-1])
        text = list(client.completions.create(model="tiny", prompt="What is 4 + 4?", stream=True))
        assert "".join(c.choices[0].text for c in text) == "#### 0" and text[-1].choices[0].finish_reason == "stop"
    finally:
        client.close()
    calls = endpoint.close_episode(episode_id)
    assert [call.text for call in calls] == ["#### 0", "#### 0"]
    assert chunks[-1].usage.completion_tokens == len(calls[0].response_ids)
    assert chunks[-1].usage.prompt_tokens == len(calls[0].prompt_ids)
    endpoint.close()


def test_episodes_of_two_batches_reach_their_own_engines(tokenizer):
    """Two batches played at once (the rollout queue's thread and the driver's): each episode's calls go to the
    `generate` and sampling settings it was opened with, even when one batcher pass takes both."""
    import threading

    import httpx

    endpoint = AgentEndpoint(tokenizer, "/models/tiny", "127.0.0.1", 0, max_context_tokens=64, max_new_tokens=12)
    threading.Thread(target=endpoint.batcher.serve_forever, daemon=True).start()
    engines = [ScriptedEngine(tokenizer), ScriptedEngine(tokenizer, first_right=True)]
    opened = [endpoint.open_episode(engine, SamplingParams(max_new_tokens=12 - k)) for k, engine in enumerate(engines)]

    def ask(base_url: str, left: int) -> str:
        reply = httpx.post(f"{base_url}/chat/completions", headers=bearer(endpoint.api_key),
                           json={"messages": [{"role": "user", "content": f"What is {left} + 1?"}]}, timeout=30)
        return reply.json()["choices"][0]["message"]["content"]

    answers = {}
    threads = [threading.Thread(target=lambda k=k: answers.update({k: ask(opened[k][1], 3 + k)})) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == {0: "#### 0", 1: "#### 5"}  # the first engine answers wrong, the second right
    for k, engine in enumerate(engines):
        prompts = [prompt for call in engine.calls for prompt in call[0]]
        assert len(prompts) == 1 and f"What is {3 + k} + 1?" in tokenizer.decode(prompts[0])
        assert engine.calls[0][1].max_new_tokens == 12 - k
    for episode_id, _ in opened:
        endpoint.close_episode(episode_id)
    endpoint.close()


def test_a_port_in_use_is_named(tokenizer):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"generator.http_endpoint_port: cannot listen on 127.0.0.1:{port}"):
            AgentEndpoint(tokenizer, "tiny", "127.0.0.1", port, 64, 12)


def test_bad_agent_files_are_refused(tmp_path):
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    (tmp_path / "agents.py").write_text("def run(base_url, row):\n    return 1.0\n\n"
                                        "async def two(base_url, row):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"environment.agent_fn: importing .*broken.py failed: .*no_such_module"):
        load_agent(f"{tmp_path}/broken.py:run")
    with pytest.raises(ValueError, match="is function run, not an async function; define it as `async def run"):
        load_agent(f"{tmp_path}/agents.py:run")
    with pytest.raises(ValueError, match=r"cannot be called as run\(base_url, row, api_key\): .* \(the endpoint "
                                         r"answers only requests with the run's key"):
        load_agent(f"{tmp_path}/agents.py:two")


@pytest.mark.parametrize("returned,message", [
    (math.nan, "returned the reward nan; rewards must be finite numbers"),
    ("yes", "returned 'yes' (str); return a number"),
    ({"score": 1.0, "note": "x"}, "returned note='x'; extra entries must be numbers"),
])
def test_bad_agent_results_are_named_with_the_row(tokenizer, endpoint, monkeypatch, returned, message):
    import rl.trainer.multi_turn.agents as agents_module

    async def agent(base_url, row, api_key):
        async with httpx.AsyncClient(headers=bearer(api_key)) as client:
            await client.post(f"{base_url}/chat/completions", json={"messages": row["prompt"]})
        return returned

    monkeypatch.setattr(agents_module, "load_object", lambda reference, key: agent)
    with pytest.raises(EpisodeError, match=re.escape(f"environment.agent_fn=my.py:run on train.jsonl row 4 "
                                                     f"(sample 0) {message}")):
        agents(endpoint, "my.py:run").run(ScriptedEngine(tokenizer), [record(1, 2, 4)], [[]],
                                          SamplingParams(n=1, max_new_tokens=12))


def test_a_hanging_agent_is_scored_zero_with_reward_on_error_zero(tokenizer, endpoint, monkeypatch, capsys):
    import rl.trainer.multi_turn.agents as agents_module

    async def agent(base_url, row, api_key):
        async with httpx.AsyncClient(headers=bearer(api_key)) as client:
            await client.post(f"{base_url}/chat/completions", json={"messages": row["prompt"]})
        if row["index"] == 1:
            await asyncio.sleep(60)
        return 1.0

    monkeypatch.setattr(agents_module, "load_object", lambda reference, key: agent)
    episodes = agents(endpoint, "my.py:run", on_error="zero", timeout_s=1.0)
    trajectories = episodes.run(ScriptedEngine(tokenizer), [record(1, 2, 0), record(3, 4, 1)], [[], []],
                                SamplingParams(n=1, max_new_tokens=12))
    assert [(t.reward, t.finish_reason) for t in trajectories] == [(1.0, "stop"), (0.0, "error")]
    assert "did not finish within environment.agent_timeout_s=1.0 s" in capsys.readouterr().out
    assert episodes.rewards(trajectories)[1]["reward_errors"] == 1.0


@pytest.mark.parametrize("statement,why", [
    ("sys.exit(0)", "it called sys.exit(0) (SystemExit)"),
    ("os._exit(0)", "it called os._exit(0)"),
    ("raise KeyboardInterrupt", "it raised KeyboardInterrupt"),
])
def test_an_agent_that_tries_to_exit_ends_the_batch_named_whatever_the_concurrency(tokenizer, endpoint, monkeypatch,
                                                                                    statement, why):
    """Eight episodes at once, every one exiting after its first reply, with data.reward_on_error=zero and a
    deadline (under which asyncio runs the agent as a task of its own): the batch ends with the first one named
    (before, the other episodes' SystemExit left the event loop and the launcher exited 0; os._exit ended the
    process)."""
    import os
    import sys

    import rl.trainer.multi_turn.agents as agents_module

    async def agent(base_url, row, api_key):
        async with httpx.AsyncClient(headers=bearer(api_key)) as client:
            await client.post(f"{base_url}/chat/completions", json={"messages": row["prompt"]})
        exec(statement, {"os": os, "sys": sys})
        return 1.0

    monkeypatch.setattr(agents_module, "load_object", lambda reference, key: agent)
    with pytest.raises(EpisodeError) as error:
        agents(endpoint, "my.py:run", on_error="zero", timeout_s=30.0).run(
            ScriptedEngine(tokenizer), [record(i, 1, i) for i in range(4)], [[]] * 4,
            SamplingParams(n=2, max_new_tokens=12))
    assert re.fullmatch(rf"environment\.agent_fn=my\.py:run on train\.jsonl row \d \(sample \d\): {re.escape(why)}; "
                        "user code may not end the run, raise an exception instead", str(error.value)), error.value


def test_a_blocked_agent_is_abandoned_at_its_deadline_naming_its_line(tokenizer, endpoint, monkeypatch, capsys):
    """A synchronous sleep in an async agent stalls only its own episode: the other finishes, the blocked one is
    scored 0 (data.reward_on_error=zero) a grace second past environment.agent_timeout_s, named with the line."""
    import rl.trainer.multi_turn.agents as agents_module

    async def agent(base_url, row, api_key):
        async with httpx.AsyncClient(headers=bearer(api_key)) as client:
            await client.post(f"{base_url}/chat/completions", json={"messages": row["prompt"]})
        if row["index"] == 1:
            time.sleep(60)
        return 1.0

    blocking_line = agent.__code__.co_firstlineno + 4
    monkeypatch.setattr(agents_module, "load_object", lambda reference, key: agent)
    episodes = agents(endpoint, "my.py:run", on_error="zero", timeout_s=1.0)
    started = time.monotonic()
    trajectories = episodes.run(ScriptedEngine(tokenizer), [record(1, 2, 0), record(3, 4, 1)], [[], []],
                                SamplingParams(n=1, max_new_tokens=12))
    took = time.monotonic() - started
    assert [(t.reward, t.finish_reason) for t in trajectories] == [(1.0, "stop"), (0.0, "error")]
    assert took < 30, f"the blocked episode held the batch {took:.1f} s"
    printed = capsys.readouterr().out
    assert (f"environment.agent_fn=my.py:run on train.jsonl row 1 (sample 0) did not finish within "
            f"environment.agent_timeout_s=1.0 s, blocked at {__file__}:{blocking_line} in agent") in printed, printed


async def two_turn_agent(base_url: str, row: dict, api_key: str) -> float:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120.0)
    messages = list(row["prompt"])
    first = await client.chat.completions.create(model="tiny", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "What is 1 + 1?"}]
    await client.chat.completions.create(model="tiny", messages=messages)
    await client.close()
    return 1.0


def test_with_a_real_engine_trajectories_are_the_sampled_ids_and_the_templated_turns(tmp_path, tokenizer,
                                                                                      endpoint, monkeypatch):
    """An untrained model's replies (any tokens, special ones included), through the HF engine."""
    import rl.trainer.multi_turn.agents as agents_module
    from rl.core.generation import build_engine
    from rl.tasks.embedded import write_untrained_job

    job = write_untrained_job(tmp_path, seed=0)
    engine = build_engine("hf", str(job.model_path), str(job.model_path))
    sampled: list[list[int]] = []

    def generate(prompts, params):
        rollouts = engine.generate(prompts, params)
        sampled.extend(r.response_ids for r in rollouts)
        return rollouts

    monkeypatch.setattr(agents_module, "load_object", lambda reference, key: two_turn_agent)
    # each turn's four calls in one batch, as the seeds below were chosen for, however loaded the machine
    monkeypatch.setattr(endpoint.batcher, "linger_s", 30.0)
    records = [record(3, 4, 0), record(10, 20, 1)]
    trajectories = agents(endpoint, "two.py:run").run(generate, records, [[], []],
                                                      SamplingParams(n=2, max_new_tokens=6, seed=1))
    assert len(sampled) == 8
    second_turn = encode(tokenizer, "<|user|>What is 1 + 1?<|end|><|assistant|>")
    for t in trajectories:
        if t.calls == 2:  # one chain: sampled ids, then the template's text for what followed, then sampled ids
            first = next(ids for ids in sampled if t.response_ids[:len(ids)] == ids and t.response_mask[len(ids)]
                         is False)
            between = t.response_ids[len(first):len(t.response_ids) - t.response_mask[::-1].index(False)]
            closing = [] if first[-1:] == [tokenizer.eos_token_id] else [tokenizer.eos_token_id]
            assert between == closing + second_turn
            assert t.response_ids[len(first) + len(between):] in sampled
        else:  # a reply the template cannot continue (it held special tokens): re-templated, a trajectory of its own
            assert t.calls == 1 and t.response_ids in sampled
    # every call is in a trajectory; whether a chain forms depends on what the untrained model samples, which
    # varies with the order the episodes' threads reach the batch: the chained case is checked where it occurs
    assert sum(t.calls for t in trajectories) == 8


def test_an_engine_failure_ends_the_run_as_itself(tokenizer, endpoint):
    def broken(prompts, params):
        raise RuntimeError("generation engine 0 died")

    with pytest.raises(RuntimeError, match="generation engine 0 died"):
        agents(endpoint).run(broken, [record(1, 2)], [[]], SamplingParams(n=1, max_new_tokens=12))
