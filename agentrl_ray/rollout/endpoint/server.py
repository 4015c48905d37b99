"""`/v1/chat/completions` served by a rollout worker's engine, for agent programs written against OpenAI's API.

The server runs in the rollout worker's process (on the rollout node, bound to 127.0.0.1: the agent processes are
the worker's children) on the worker's event loop, which also runs the engine's generation (calls that arrive
meanwhile wait in the socket's backlog). Each trajectory has its own API key (`open`): the key attributes a call to
its trajectory, its budget and its seed. Requests are batched: the engine runs once every open trajectory is
waiting on a call, or no call arrived for `BATCH_WAIT_S` (at most `BATCH_MAX_WAIT_S` after the first), with all
calls then waiting (one engine call per temperature/top-p).

Supported: `messages` (text content), `tools` with `tool_choice` auto or none (required/named choices are answered
like auto: the engine has no constrained decoding), `n`, `temperature` (default: the rollout's, so a held-out
evaluation decodes as configured), `top_p`, `max_tokens` / `max_completion_tokens` (capped by
`rollout.max_tokens_per_turn` and the room left in `rollout.max_total_tokens`), `stop` strings (the completion is
cut after the first token whose text reaches one; those ids are what is trained), `logprobs`, `stream` (the whole
reply as one chunk, then the finish chunk: cheap, since the engine does not stream), and vLLM's `return_token_ids`
(the prompt ids and each choice's sampled ids in the answer). `seed` is ignored: seeds come from the run's.
Tool calls come back in OpenAI's form, parsed from the model's own markup (`rollout.tool_format`, hermes by default).
Refused with OpenAI-style errors: an unknown key (401), a call past `rollout.max_turns` or a prompt with no room
left in `rollout.max_total_tokens` (400, codes `turn_budget_exceeded` / `context_length_exceeded`), a malformed
request (400).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import socket
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.config import RolloutConfig
from agentrl_ray.messages import assistant_message, to_openai
from agentrl_ray.rollout.endpoint.calls import Call, Choice, Renderer
from agentrl_ray.rollout.engine import Engine, Generation
from agentrl_ray.rollout.tool_format import tool_format

logger = logging.getLogger(__name__)

BATCH_WAIT_S = 0.05  # a batch starts once no call arrived for this long (or every open trajectory is waiting)
BATCH_MAX_WAIT_S = 0.5  # and at the latest this long after its first call
MAX_N = 16


@dataclass
class Session:
    """One trajectory's view of the endpoint: its calls, and why a call was refused (if one was)."""

    key: str
    temperature: float
    seed: int
    calls: list[Call] = field(default_factory=list)
    refused: str = ""  # the error code of the last refused call
    waiting: bool = False
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Responses API: id -> conversation


@dataclass
class _Pending:
    session: Session
    call: Call
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind


class Endpoint:
    def __init__(self, engine: Engine, tokenizer, cfg: RolloutConfig, version: Callable[[], int]) -> None:
        self.engine, self.tokenizer, self.cfg, self.version = engine, tokenizer, cfg, version
        self.renderer = Renderer(tokenizer)
        self.tool_format = tool_format(tokenizer, cfg.tool_format)
        self.sessions: dict[str, Session] = {}
        self.pending: list[_Pending] = []
        self._wake = asyncio.Event()
        self.base_url = ""
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns the base URL (`.../v1`)."""
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._http_chat, methods=["POST"]),
                Route("/v1/messages", self._http_messages, methods=["POST"]),
                Route("/v1/responses", self._http_responses, methods=["POST"]),
                Route("/v1/models", self._http_models, methods=["GET"]),
            ]
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        self._tasks = [asyncio.create_task(server.serve(sockets=[sock])), asyncio.create_task(self._batches())]
        while not server.started:
            if self._tasks[0].done():
                self._tasks[0].result()  # raises the server's error
            await asyncio.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self.base_url

    def open(self, key: str, temperature: float, seed: int) -> Session:
        session = self.sessions[key] = Session(key, temperature, seed)
        return session

    def finish(self, key: str) -> Session:
        """The trajectory's agent ended: its key stops working, and batches stop waiting for it."""
        session = self.sessions.pop(key)
        self._wake.set()
        return session

    # ---------------------------------------------------------------- HTTP

    async def _http_models(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "agentrl"}]})

    async def _http_chat(self, request):
        from starlette.responses import JSONResponse, StreamingResponse

        try:
            session = self._session(request)
            if session is None:
                raise ApiError(401, "unknown API key: each trajectory gets its own", "invalid_api_key")
            try:
                body = await request.json()
            except json.JSONDecodeError as e:
                raise ApiError(400, f"request body is not JSON: {e}", "invalid_json") from None
            answer = await self.chat(session, body)
        except ApiError as e:
            error = {"message": e.message, "type": e.kind, "param": None, "code": e.code}
            return JSONResponse({"error": error}, status_code=e.status)
        if body.get("stream"):
            return StreamingResponse(_sse(answer), media_type="text/event-stream")
        return JSONResponse(answer)

    def _session(self, request) -> Session | None:
        """The trajectory a request's key names: a Bearer token (OpenAI's clients) or `x-api-key` (Anthropic's)."""
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return self.sessions.get(key or request.headers.get("x-api-key", "").strip())

    async def _http_messages(self, request):
        """Anthropic's Messages API, served as the chat-completions request it means (endpoint/anthropic.py)."""
        from starlette.responses import JSONResponse, StreamingResponse

        from agentrl_ray.rollout.endpoint import anthropic

        try:
            session = self._session(request)
            if session is None:
                raise ApiError(401, "unknown API key: each trajectory gets its own", "authentication_error")
            try:
                body = await request.json()
                chat_body = anthropic.chat_request(body)
            except json.JSONDecodeError as e:
                raise ApiError(400, f"request body is not JSON: {e}", "invalid_json") from None
            except anthropic.DialectError as e:
                raise ApiError(400, str(e), "invalid_request_error") from None
            answer = await self.chat(session, chat_body)
        except ApiError as e:
            kind = {401: "authentication_error", 500: "api_error"}.get(e.status, "invalid_request_error")
            return JSONResponse(anthropic.error_body(kind, e.message), status_code=e.status)
        message = anthropic.messages_answer(answer, session.calls[-1].choices[0].stop)
        if body.get("stream"):
            return StreamingResponse(anthropic.event_stream(message), media_type="text/event-stream")
        return JSONResponse(message)

    async def _http_responses(self, request):
        """OpenAI's Responses API, served as the chat-completions request it means (endpoint/responses.py)."""
        from starlette.responses import JSONResponse, StreamingResponse

        from agentrl_ray.rollout.endpoint import responses
        from agentrl_ray.rollout.endpoint.anthropic import DialectError

        try:
            session = self._session(request)
            if session is None:
                raise ApiError(401, "unknown API key: each trajectory gets its own", "invalid_api_key")
            try:
                body = await request.json()
                chat_body = responses.chat_request(body, session.responses)
            except json.JSONDecodeError as e:
                raise ApiError(400, f"request body is not JSON: {e}", "invalid_json") from None
            except DialectError as e:
                raise ApiError(400, str(e), "invalid_request") from None
            answer = await self.chat(session, chat_body)
        except ApiError as e:
            return JSONResponse(responses.error_body(e.message, e.code, e.kind), status_code=e.status)
        resp = responses.response(answer, body)
        session.responses[resp["id"]] = [*chat_body["messages"], answer["choices"][0]["message"]]
        if body.get("stream"):
            return StreamingResponse(responses.event_stream(resp), media_type="text/event-stream")
        return JSONResponse(resp)

    # ---------------------------------------------------------------- one call

    async def chat(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        """One chat-completions request of `session`'s trajectory: the OpenAI answer as a dict."""
        messages, n = body.get("messages"), body.get("n") or 1
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: expected a non-empty list of chat messages", "invalid_messages")
        if not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise ApiError(400, f"n must be an integer in [1, {MAX_N}]", "invalid_n")
        if len(session.calls) >= self.cfg.max_turns:
            session.refused = "turn_budget_exceeded"
            why = f"this trajectory made its {self.cfg.max_turns} calls (rollout.max_turns)"
            raise ApiError(400, why, session.refused)
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        try:
            call = self.renderer.render(messages, tools, session.calls)
        except (ValueError, KeyError, TypeError) as e:
            raise ApiError(400, f"messages: {e}", "invalid_messages") from None
        room = self.cfg.max_total_tokens - len(call.prompt_ids)
        if room < 1:
            session.refused = "context_length_exceeded"
            raise ApiError(
                400,
                f"the prompt is {len(call.prompt_ids)} tokens: no room left in rollout.max_total_tokens "
                f"({self.cfg.max_total_tokens})",
                session.refused,
            )
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.cfg.max_tokens_per_turn
        temperature = body.get("temperature")
        pending = _Pending(
            session,
            call,
            max_tokens=max(1, min(int(asked), self.cfg.max_tokens_per_turn, room)),
            temperature=float(session.temperature if temperature is None else temperature),
            top_p=float(body.get("top_p") or self.cfg.top_p),
            n=n,
            future=asyncio.get_running_loop().create_future(),
        )
        self.pending.append(pending)
        session.waiting = True
        self._wake.set()
        try:
            gens: list[Generation] = await pending.future
        finally:
            session.waiting = False
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        call.policy_version = self.version()
        call.choices = [self._choice(g, stops, call.index) for g in gens]
        session.calls.append(call)
        logger.debug("%s call %d: %d prompt ids, %s", session.key, call.index, len(call.prompt_ids), call.choices)
        return self._answer(call, body)

    def _choice(self, gen: Generation, stops: list[str], turn: int) -> Choice:
        ids, logprobs = list(gen.token_ids), list(gen.logprobs)
        finish = gen.finish_reason
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        hit = sorted((text.find(s), s) for s in stops if s and s in text)
        stop = hit[0][1] if hit else None
        if hit:
            cut = hit[0][0]
            k = stop_prefix_len(self.tokenizer, ids, cut)
            ids, logprobs, text, finish = ids[:k], logprobs[:k], text[:cut], "stop"
        eos = self.tokenizer.eos_token_id
        ended = finish == "stop" and not hit and bool(ids) and ids[-1] == eos
        text = text.removesuffix(self.tokenizer.eos_token or "")
        parsed = self.tool_format.parse(text)
        message = assistant_message(text, parsed, turn)
        if parsed.calls:
            finish = "tool_calls"
        return Choice(ids, logprobs, finish, message, ended, stop)

    def _answer(self, call: Call, body: dict[str, Any]) -> dict[str, Any]:
        choices = []
        for i, choice in enumerate(call.choices):
            message = to_openai([choice.message])[0]
            message.setdefault("content", None)
            out: dict[str, Any] = {"index": i, "message": message, "finish_reason": choice.finish_reason}
            if body.get("logprobs"):
                tokens = self.tokenizer.convert_ids_to_tokens(choice.token_ids)
                out["logprobs"] = {
                    "content": [
                        {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(tokens, choice.logprobs)
                    ]
                }
            if body.get("return_token_ids"):
                out["token_ids"] = choice.token_ids
            choices.append(out)
        completion_tokens = sum(len(c.token_ids) for c in call.choices)
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "policy",
            "choices": choices,
            "usage": {
                "prompt_tokens": len(call.prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(call.prompt_ids) + completion_tokens,
            },
        }
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = call.prompt_ids
        return answer

    # ---------------------------------------------------------------- batching

    async def _batches(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.pending:
                continue
            while any(not s.waiting for s in self.sessions.values()):
                # Calls still arriving (programs starting, tools running): wait for a gap, up to BATCH_MAX_WAIT_S.
                deadline = min(self.pending[0].arrived + BATCH_MAX_WAIT_S, self.pending[-1].arrived + BATCH_WAIT_S)
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except TimeoutError:
                    break
                self._wake.clear()
            batch, self.pending = self.pending, []
            keys = sorted({(p.temperature, p.top_p) for p in batch})
            for temperature, top_p in keys:
                part = [p for p in batch if (p.temperature, p.top_p) == (temperature, top_p)]
                try:
                    # On this (the worker's) thread, as the built-in loop calls it: vLLM CPU binds its OpenMP threads
                    # to the thread that started it and fails a call from another ("thread_num 1 vs. 2"). Calls that
                    # arrive meanwhile wait in the socket's backlog and join the next batch.
                    gens = self._generate(part, temperature, top_p)
                except Exception as e:  # noqa: BLE001 - the engine's failure fails these calls (500), not the server
                    for p in part:
                        if not p.future.done():
                            p.future.set_exception(ApiError(500, f"engine error: {e}", "engine_error", "server_error"))
                    continue
                for p in part:
                    if not p.future.done():
                        p.future.set_result(gens[: p.n])
                    gens = gens[p.n :]

    def _generate(self, part: list[_Pending], temperature: float, top_p: float) -> list[Generation]:
        prompts, budgets, seeds = [], [], []
        for p in part:
            for j in range(p.n):
                prompts.append(p.call.prompt_ids)
                budgets.append(p.max_tokens)
                seeds.append(zlib.crc32(f"{p.session.seed}/{p.session.key}/{p.call.index}/{j}".encode()))
        return self.engine.generate(
            prompts,
            budgets,
            temperature=temperature,
            top_p=top_p,
            stop_token_ids=self.tool_format.stop_token_ids(self.tokenizer),
            seeds=seeds,
        )


async def _sse(answer: dict[str, Any]):
    """The answer as OpenAI's stream: one chunk with each choice's whole message, one with its finish reason."""
    base = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    for choice in answer["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(message["tool_calls"])]
        first = {"index": choice["index"], "delta": delta, "finish_reason": None, "logprobs": choice.get("logprobs")}
        last = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        yield f"data: {json.dumps(base | {'choices': [first]})}\n\n"
        yield f"data: {json.dumps(base | {'choices': [last]})}\n\n"
    yield f"data: {json.dumps(base | {'choices': [], 'usage': answer['usage']})}\n\n"
    yield "data: [DONE]\n\n"


def stop_prefix_len(tokenizer, ids: list[int], cut: int) -> int:
    """The length of the shortest prefix of the sampled `ids` whose text runs past `cut` characters (where the stop
    string starts): the ids that are trained.

    A binary search, since a prefix's text never gets shorter as ids are added (bytes of a character not yet whole
    decode to one replacement character): log2(len(ids)) decodes, where decoding every prefix in turn was quadratic
    (1.3 s for a stop string 4,000 tokens in).
    """
    return bisect.bisect_right(range(len(ids) + 1), cut, key=lambda k: len(tokenizer.decode(ids[:k])))
