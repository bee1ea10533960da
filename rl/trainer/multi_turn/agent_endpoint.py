"""The OpenAI-compatible endpoint over the generation engines (`generator.enable_http_endpoint`).

A FastAPI app served by uvicorn on a thread of the driver. Each episode has a base URL of its own,
`http://host:port/episodes/<id>/v1`, under which `/chat/completions`, `/completions` and `/models` answer as the
OpenAI API does (one choice per request; `stream=true` gets the reply as server-sent events once it is
generated), so agent code written against the `openai` client needs only `base_url` and the run's key. Every call
is recorded token for token in its episode (`agent_records`).

Only the run's agents are answered: every request must carry the run's key (`Authorization: Bearer <key>`, the
`openai` client's `api_key`; a fresh random key per run, or the one in generator.http_endpoint_api_key_file), else
401. A request body is at most `MAX_REQUEST_BYTES` (413), an episode makes at most generator.max_turns calls (429),
connections beyond `max_connections` are answered 503, and a malformed request (a field of the wrong type, token ids
outside the vocabulary) is a 400 naming the field: nothing a client sends ends the run.

The calls of all episodes are gathered into batches (`CallBatcher`): one engine call serves every request waiting
at that moment, flushed as soon as every open episode has one waiting, or after a short linger. The sampling
distribution is the run's (generator.temperature / top_p / top_k for training, the evaluation settings for
validation), whatever a request asks, since the trainer computes logprobs at the run's temperature; a request's
`max_tokens` (at most generator.max_generate_length) and `stop` strings are honoured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import secrets
import socket
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rl.core.generation.engine import SamplingParams
from rl.trainer.multi_turn.agent_batcher import CallBatcher
from rl.trainer.multi_turn.agent_records import RecordedCall, chat_prompt, completion_prompt, message_pairs

MAX_REQUEST_BYTES = 4 << 20
"""The largest request body read (a conversation of ~1M characters), beyond any context a model here takes."""
NUMBER = (int, float)
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"), "n": ((int,), "an integer"), "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"), "stream": ((bool,), "true or false"),
    "stream_options": ((dict,), "an object"), "temperature": (NUMBER, "a number"), "top_p": (NUMBER, "a number"),
    "presence_penalty": (NUMBER, "a number"), "frequency_penalty": (NUMBER, "a number"),
    "seed": ((int,), "an integer"), "user": ((str,), "a string"), "top_logprobs": ((int,), "an integer"),
    "stop": ((str, list), "a string or a list of strings"),
}
"""The OpenAI request fields a request may set (null: unset), and their JSON types; others are ignored."""


class EndpointError(Exception):
    """A request the endpoint refuses: its HTTP status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.code, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class _Episode:
    generate: Any  # what serves its calls (a `GenerationEngine.generate`-like function)
    params: SamplingParams  # its sampling settings (n=1)
    calls: list[RecordedCall] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    started: int = 0  # calls accepted, finished or not


class AgentEndpoint:
    """The server, the open episodes and what their calls recorded. Each episode is opened with what serves its
    calls (a `GenerationEngine.generate`-like function) and its sampling settings; `version` is the policy version
    of the engines' weights, recorded with each call."""

    def __init__(self, tokenizer, model_name: str, host: str, port: int, max_context_tokens: int,
                 max_new_tokens: int, api_key: str | None = None, max_episode_calls: int | None = None,
                 max_connections: int = 256):
        self.tokenizer, self.model_name, self.host = tokenizer, model_name, host
        self.max_context_tokens, self.max_new_tokens = max_context_tokens, max_new_tokens
        self.api_key = api_key or secrets.token_urlsafe(32)
        self.max_episode_calls, self.max_connections = max_episode_calls, max_connections
        self.vocab_size = len(tokenizer)
        self.names = {model_name, model_name.rstrip("/").rsplit("/", 1)[-1]}
        self.episodes: dict[str, _Episode] = {}
        self.lock = threading.Lock()
        self.version = 0
        self.batcher = CallBatcher(lambda: len(self.episodes))  # run by `AgentEpisodes` on the main thread
        self.sock = _bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.server = None
        self._serve()

    @property
    def url(self) -> str:
        """Where this machine's agents reach the endpoint (loopback when it listens on every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{_url_host(host)}:{self.port}"

    @property
    def bound(self) -> str:
        """The address the socket is bound to, as a URL (what the run prints)."""
        return f"http://{_url_host(self.sock.getsockname()[0])}:{self.port}"

    def check_key(self, authorization: str | None) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            raise EndpointError(401, "this endpoint answers only its run's agents: send the run's key as "
                                "`Authorization: Bearer <key>` (the openai client's api_key; the agent function "
                                "is given it)", code="invalid_api_key")

    def _serve(self) -> None:
        import uvicorn

        # keep-alive far past any wait between an agent's calls: a connection the server closes while the client
        # reuses it fails that request; log_config=None leaves the process's logging as it is
        config = uvicorn.Config(build_app(self), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=3600, log_config=None, limit_concurrency=self.max_connections)
        self.server = uvicorn.Server(config)
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_until_complete(self.server.serve(sockets=[self.sock]))

        threading.Thread(target=serve, name="agent-endpoint", daemon=True).start()
        started.wait(30)

    def close(self) -> None:
        if self.server is not None:
            self.server.should_exit = True

    def open_episode(self, generate, params: SamplingParams) -> tuple[str, str]:
        """(episode id, its base URL); its calls go to `generate` with `params`."""
        episode_id = uuid.uuid4().hex[:12]
        with self.lock:
            self.episodes[episode_id] = _Episode(generate, dataclasses.replace(params, n=1))
        return episode_id, f"{self.url}/episodes/{episode_id}/v1"

    def close_episode(self, episode_id: str) -> list[RecordedCall]:
        """The episode's recorded calls; later calls to its URL are refused."""
        with self.lock:
            episode = self.episodes.pop(episode_id, None)
        with self.batcher.cond:
            self.batcher.cond.notify_all()  # one fewer episode to wait for
        return [] if episode is None else episode.calls

    def episode(self, episode_id: str) -> _Episode:
        with self.lock:
            episode = self.episodes.get(episode_id)
        if episode is None:
            raise EndpointError(404, f"no open episode {episode_id!r}: an episode's base URL works only while its "
                                "agent runs", code="not_found_error")
        return episode

    @staticmethod
    def check_fields(body: dict) -> None:
        for name, (types, what) in FIELD_TYPES.items():
            value = body.get(name)
            if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
                raise EndpointError(400, f"{name} must be {what}, got {json.dumps(value)[:80]}", name)
        stop = body.get("stop")
        if isinstance(stop, list) and not all(isinstance(item, str) for item in stop):
            raise EndpointError(400, "stop must be a string or a list of strings", "stop")

    @staticmethod
    def check_logprobs(body: dict, chat: bool) -> None:
        """`logprobs`: true or false for chat, a number of alternatives (an integer) for text completions."""
        value = body.get("logprobs")
        if value is not None and (isinstance(value, bool) != chat or not isinstance(value, int)):
            raise EndpointError(400, f"logprobs must be {'true or false' if chat else 'an integer'}, got "
                                f"{json.dumps(value)[:80]}", "logprobs")

    def check_prompt_ids(self, prompt: Any) -> None:
        """A completion prompt given as token ids: each an id of the model's vocabulary."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            wrong = [t for t in prompt if isinstance(t, bool) or not 0 <= t < self.vocab_size]
            if wrong:
                raise EndpointError(400, f"prompt holds token ids outside the model's vocabulary of "
                                    f"{self.vocab_size}: {wrong[:5]}", "prompt")

    def check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model not in self.names:
            raise EndpointError(404, f"the model {model!r} does not exist; this endpoint serves "
                                f"{self.model_name!r} (GET /v1/models lists it)", "model", "model_not_found")

    @staticmethod
    def sampling(episode: _Episode, body: dict) -> SamplingParams:
        if body.get("n", 1) != 1:
            raise EndpointError(400, f"n={body.get('n')} is not supported: one choice per request (call again for "
                                "another sample)", "n")
        changes: dict[str, Any] = {}
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None:
            if not isinstance(limit, int) or limit < 1:
                raise EndpointError(400, f"max_tokens must be an integer >= 1, got {limit!r}", "max_tokens")
            changes["max_new_tokens"] = min(limit, episode.params.max_new_tokens)
        stop = body.get("stop")
        if stop:
            stop = [stop] if isinstance(stop, str) else list(stop)
            changes["stop"] = tuple(dict.fromkeys([*episode.params.stop, *stop]))
        return dataclasses.replace(episode.params, **changes)

    async def complete(self, episode_id: str, body: dict, chat: bool) -> tuple[RecordedCall, SamplingParams]:
        """Builds the call's prompt from the episode's tokens, runs it, and records it."""
        episode = self.episode(episode_id)
        self.check_fields(body)
        self.check_logprobs(body, chat)
        self.check_model(body)
        if not chat:
            self.check_prompt_ids(body.get("prompt"))
        params = self.sampling(episode, body)
        with episode.lock:
            if self.max_episode_calls is not None and episode.started >= self.max_episode_calls:
                raise EndpointError(429, f"this episode has made its {self.max_episode_calls} calls "
                                    "(generator.max_turns): end the episode, or raise generator.max_turns",
                                    code="rate_limit_exceeded")
            episode.started += 1
            previous = episode.calls[-1] if episode.calls else None
            try:
                call = (chat_prompt(self.tokenizer, message_pairs(body.get("messages")), previous) if chat
                        else completion_prompt(self.tokenizer, body.get("prompt"), previous))
            except ValueError as error:
                raise EndpointError(400, str(error), "messages" if chat else "prompt") from None
        room = self.max_context_tokens - len(call.prompt_ids)
        if room < 1:
            raise EndpointError(400, f"the prompt has {len(call.prompt_ids)} tokens, leaving no room for a reply "
                                f"within generator.max_input_length={self.max_context_tokens} tokens of context; "
                                "shorten the conversation or raise generator.max_input_length",
                                "messages" if chat else "prompt", "context_length_exceeded")
        params = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, room))
        version = self.version
        rollout = await asyncio.wrap_future(self.batcher.submit(call.prompt_ids, params, episode.generate))
        call.response_ids, call.logprobs = list(rollout.response_ids), list(rollout.rollout_logprobs)
        call.finish_reason, call.version = rollout.finish_reason, version
        call.text = self.tokenizer.decode(call.response_ids, skip_special_tokens=True)
        with episode.lock:
            episode.calls.append(call)
        return call, params

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "rl"}]}


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ValueError(f"generator.http_endpoint_port: cannot listen on {host}:{port} ({error.strerror or error}); "
                         "the port is in use or the address is not this machine's: pick another "
                         "generator.http_endpoint_port (0 picks a free one) or generator.http_endpoint_host") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _usage(call: RecordedCall) -> dict:
    return {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(call.response_ids),
            "total_tokens": len(call.prompt_ids) + len(call.response_ids)}


def _chat_logprobs(tokenizer, call: RecordedCall) -> dict:
    return {"content": [{"token": tokenizer.decode([token]), "logprob": logprob, "bytes": None, "top_logprobs": []}
                        for token, logprob in zip(call.response_ids, call.logprobs, strict=True)]}


def _text_pieces(tokenizer, call: RecordedCall) -> list[str]:
    """The reply's text one sampled token at a time: each piece is what a token adds to the decoding of the tokens
    since the last piece (a character spread over several tokens waits until it is whole), so a reply costs a
    decode of a few tokens per token, not of its whole prefix. Pieces that would not join to `call.text` (a
    tokenizer whose decoding depends on more context) give way to the text as one piece."""
    ids, pieces = call.response_ids, []
    start = read = 0  # the tokens decoded for context, and those already shown
    for end in range(1, len(ids) + 1):
        shown = tokenizer.decode(ids[start:read], skip_special_tokens=True)
        text = tokenizer.decode(ids[start:end], skip_special_tokens=True)
        if len(text) > len(shown) and text.startswith(shown) and not text.endswith("\ufffd"):
            pieces.append(text[len(shown):])
            start, read = read, end
    joined = "".join(pieces)
    if joined != call.text:
        return [*pieces, call.text[len(joined):]] if call.text.startswith(joined) else [call.text]
    return pieces


def _event_stream(head: dict, choices: list[dict], body: dict, call: RecordedCall) -> StreamingResponse:
    """`stream=true`: the generated reply as OpenAI's server-sent events, one chunk per piece, the last with the
    finish reason, then the usage (with stream_options.include_usage) and `[DONE]`. The engines generate a call
    whole, so the chunks follow each other at once."""
    def events():
        for choice in choices:
            yield f"data: {json.dumps({**head, 'choices': [{'index': 0, **choice}]})}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(call)})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def build_app(endpoint: AgentEndpoint) -> FastAPI:
    app = FastAPI(title="rl agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(EndpointError)
    async def refused(request: Request, error: EndpointError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.middleware("http")
    async def authorized(request: Request, call_next):
        try:
            endpoint.check_key(request.headers.get("authorization"))
        except EndpointError as error:
            return JSONResponse(error.body(), status_code=error.status)
        return await call_next(request)

    async def body_of(request: Request) -> dict:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
            raise EndpointError(413, f"the request body has {int(declared)} bytes, more than the {MAX_REQUEST_BYTES} "
                                "this endpoint reads", code="request_too_large")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_REQUEST_BYTES:
                raise EndpointError(413, f"the request body is over the {MAX_REQUEST_BYTES} bytes this endpoint "
                                    "reads", code="request_too_large")
        try:
            body = json.loads(raw)
        except ValueError:
            raise EndpointError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise EndpointError(400, "the request body must be a JSON object")
        return body

    @app.get("/v1/models")
    @app.get("/episodes/{episode_id}/v1/models")
    async def models(episode_id: str | None = None):
        if episode_id is not None:
            endpoint.episode(episode_id)
        return endpoint.models()

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def chat(episode_id: str, request: Request):
        body = await body_of(request)
        call, _ = await endpoint.complete(episode_id, body, chat=True)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": endpoint.model_name}
        if body.get("stream"):
            pieces = [{"delta": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": None}
                      for text in _text_pieces(endpoint.tokenizer, call)]
            last = {"delta": {}, "logprobs": None, "finish_reason": call.finish_reason}
            return _event_stream({**head, "object": "chat.completion.chunk"}, [*pieces, last], body, call)
        choice = {"index": 0, "message": {"role": "assistant", "content": call.text},
                  "finish_reason": call.finish_reason,
                  "logprobs": _chat_logprobs(endpoint.tokenizer, call) if body.get("logprobs") else None}
        return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(call)}

    @app.post("/episodes/{episode_id}/v1/completions")
    async def completions(episode_id: str, request: Request):
        body = await body_of(request)
        call, _ = await endpoint.complete(episode_id, body, chat=False)
        if body.get("stream"):
            head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": endpoint.model_name,
                    "object": "text_completion"}
            pieces = [{"text": text, "logprobs": None, "finish_reason": None}
                      for text in _text_pieces(endpoint.tokenizer, call)]
            return _event_stream(head, [*pieces, {"text": "", "logprobs": None, "finish_reason": call.finish_reason}],
                                 body, call)
        logprobs = None
        if body.get("logprobs") is not None:
            tokens = [endpoint.tokenizer.decode([t]) for t in call.response_ids]
            logprobs = {"tokens": tokens, "token_logprobs": call.logprobs, "top_logprobs": None,
                        "text_offset": None}
        choice = {"index": 0, "text": call.text, "finish_reason": call.finish_reason, "logprobs": logprobs}
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": endpoint.model_name, "choices": [choice], "usage": _usage(call)}

    return app
