"""The agent endpoint as an HTTP server, with a scripted engine behind it: it answers only requests with its run's
key, names a malformed field, refuses token ids outside the vocabulary and oversized bodies unread, turns away
connections past its limit and goes on, holds an episode to its call budget, and prints the address it bound."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import openai
import pytest

from rl.core.generation.engine import SamplingParams
from rl.tasks.embedded.tokenizer import build_tokenizer
from rl.trainer.multi_turn.agent_endpoint import AgentEndpoint
from tests.testing.scripted_engine import ScriptedEngine, bearer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def served(tokenizer):
    """An endpoint whose calls are served (no AgentEpisodes.run here), with one open episode: (endpoint, base URL)."""
    server = AgentEndpoint(tokenizer, "/models/tiny", "127.0.0.1", 0, max_context_tokens=64, max_new_tokens=12,
                           max_episode_calls=2, max_connections=8)
    threading.Thread(target=server.batcher.serve_forever, daemon=True).start()
    episode_id, base_url = server.open_episode(ScriptedEngine(tokenizer), SamplingParams(max_new_tokens=12))
    yield server, base_url
    server.close_episode(episode_id)
    server.close()


ASK = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def test_only_requests_with_the_runs_key_are_answered(tokenizer, served):
    server, base_url = served
    other = AgentEndpoint(tokenizer, "/models/tiny", "127.0.0.1", 0, 64, 12)  # another run's endpoint and key
    other.close()
    root = base_url.split("/episodes/")[0]
    for headers in ({}, bearer(other.api_key), {"Authorization": server.api_key}, bearer(server.api_key + "x")):
        for reply in (httpx.post(f"{base_url}/chat/completions", json=ASK, headers=headers),
                      httpx.get(f"{base_url}/models", headers=headers),
                      httpx.get(f"{root}/v1/models", headers=headers)):
            assert reply.status_code == 401, (headers, reply.status_code)
            assert reply.json()["error"]["code"] == "invalid_api_key"
    assert len(other.api_key) >= 32 and other.api_key != server.api_key  # a fresh key per run
    with (openai.OpenAI(base_url=base_url, api_key=other.api_key, max_retries=0) as client,
          pytest.raises(openai.AuthenticationError, match="answers only its run's agents")):
        client.chat.completions.create(model="tiny", **ASK)
    assert httpx.post(f"{base_url}/chat/completions", json=ASK, headers=bearer(server.api_key)).status_code == 200


@pytest.mark.parametrize("field,value", [
    ("model", 7), ("max_tokens", "5"), ("max_tokens", 2.5), ("stream", "yes"), ("temperature", "hot"),
    ("stop", [1]), ("n", True), ("seed", 1.5), ("stream_options", [1]), ("logprobs", 2), ("messages", "hi"),
    ("messages", [{"role": 1, "content": "hi"}]),
])
def test_malformed_chat_fields_are_400s_naming_the_field(served, field, value):
    server, base_url = served
    reply = httpx.post(f"{base_url}/chat/completions", json={**ASK, field: value}, headers=bearer(server.api_key))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field, reply.json()


@pytest.mark.parametrize("prompt", [[1, 10**9], [-1], [True, 2], {"ids": [1]}])
def test_completion_token_ids_outside_the_vocabulary_are_refused(served, prompt):
    server, base_url = served
    reply = httpx.post(f"{base_url}/completions", json={"prompt": prompt}, headers=bearer(server.api_key))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt", reply.text


def test_oversized_bodies_are_refused_unread(served):
    from rl.trainer.multi_turn.agent_endpoint import MAX_REQUEST_BYTES

    server, base_url = served
    big = b'{"messages": "' + b"x" * MAX_REQUEST_BYTES + b'"}'
    declared = httpx.post(f"{base_url}/chat/completions", content=big, headers=bearer(server.api_key))
    streamed = httpx.post(f"{base_url}/chat/completions", content=iter([big[:1 << 20]] * 5),  # chunked: no length
                          headers=bearer(server.api_key))
    for reply in (declared, streamed):
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large", reply.text
    assert httpx.post(f"{base_url}/chat/completions", json=ASK, headers=bearer(server.api_key)).status_code == 200


def test_connections_past_the_limit_get_503_and_the_endpoint_goes_on(served):
    server, base_url = served
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(server.max_connections)]
    try:
        for sock in idle:  # each one accepted and counted before the next request
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + server.api_key.encode()
                         + b"\r\n\r\n")
            assert sock.recv(16).startswith(b"HTTP/1.1 ")
        refused = httpx.get(f"{base_url}/models", headers=bearer(server.api_key))
        assert refused.status_code == 503, refused.text
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while httpx.get(f"{base_url}/models", headers=bearer(server.api_key)).status_code != 200:
        assert time.monotonic() < deadline, "the closed connections were never released"
        time.sleep(0.05)


def test_an_episode_makes_at_most_max_turns_calls(served):
    server, base_url = served
    replies = [httpx.post(f"{base_url}/chat/completions", json=ASK, headers=bearer(server.api_key)) for _ in range(3)]
    assert [reply.status_code for reply in replies] == [200, 200, 429]
    assert "made its 2 calls (generator.max_turns)" in replies[2].json()["error"]["message"]


def test_the_printed_address_is_the_bound_one(tokenizer):
    server = AgentEndpoint(tokenizer, "tiny", "localhost", 0, 64, 12)
    try:
        assert server.bound == f"http://127.0.0.1:{server.port}"
    finally:
        server.close()
