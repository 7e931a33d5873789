"""A recording OpenAI-compatible proxy: agent harnesses call the model through it, and every
call (request, response, usage, latency) lands in the episode's trajectory.

The proxy runs in the controller (an aiohttp server on 127.0.0.1) and forwards
``POST /v1/chat/completions`` (plain and ``stream: true``) and ``GET /v1/models`` to the
configured upstream. A harness identifies its episode by the key of its ``ProxySession``
(``Authorization: Bearer <key>``, where it would put its OpenAI key); the upstream's real key
never enters a sandbox. An unknown key is a 401; a session past its ``max_calls`` gets a 400
the harness cannot retry its way around.

Reaching it from inside a sandbox without giving the sandbox a network:
``serve_into(sandbox, port)`` starts a relay in the sandbox (``MUX_RELAY``, the image's
python3) that listens on the sandbox's loopback and carries every connection it accepts over
one ``open_stream`` to the controller, which connects each to ``127.0.0.1:port`` here. The
sandbox sees ``http://127.0.0.1:<sandbox port>/v1``; nothing else of the controller's.

Harness mode, token in and token out: with ``Upstream(tokens=True)`` every forwarded call asks
the backend (vLLM's or SGLang's OpenAI-compatible server) for ``logprobs`` and
``return_token_ids``, and the call keeps the prompt's ids, the reply's ids and their logprobs
as arrays (``ModelCall.prompt_ids``/``token_ids``/``logprobs``; streamed calls too).
``stitch_calls`` turns an episode's calls into ``TurnTokens``: consecutive calls that extend
each other are one trainable sequence, a call that rewrites history starts a new one.

Frames on that stream, both ways: ``>IBI`` (connection id, kind, length) then the payload;
kinds: OPEN (sandbox -> controller, a new connection), DATA, EOF (that side sent all it
will), CLOSE (controller -> sandbox: close the connection).
"""

from __future__ import annotations

import json
import secrets
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from orchard_async.errors import ConfigError
from orchard_async.records.trajectory import TurnTokens

if TYPE_CHECKING:
    from aiohttp import web

    from orchard_async.protocols import Sandbox

START_TIMEOUT = 30.0  # seconds for the relay in the sandbox to say which port it listens on


class ModelCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One recorded model call. ``response`` is the upstream's JSON reply; for a streamed
    call, the chunks put back together as one ``chat.completion`` (``chunks`` counts them)."""

    index: int
    path: str
    started_s: float  # since the session opened
    latency_s: float  # until the last byte of the response
    status: int
    request: dict[str, Any] = {}
    response: dict[str, Any] = {}
    usage: dict[str, int] = {}
    stream: bool = False
    chunks: int = 0
    first_token_s: float | None = None  # streamed calls: until the first chunk
    error: str = ""
    # With ``Upstream(tokens=True)``: the backend's prompt ids, sampled ids and their logprobs
    # (``stitch_calls`` makes them a trainer's sequences)
    prompt_ids: list[int] = []
    token_ids: list[int] = []
    logprobs: list[float] = []


@dataclass
class Upstream:
    """Where calls go: ``base_url`` ends in ``/v1`` (OPENAI_BASE_URL style). ``model``, when
    set, replaces the model a harness asks for (harnesses need not know the served name)."""

    base_url: str
    api_key: str | None = None
    model: str | None = None
    timeout: float = 600.0
    # Ask the backend (vLLM's, SGLang's OpenAI-compatible server) for the token ids of the
    # prompt and the reply and the reply's logprobs (``logprobs``, ``return_token_ids``), and
    # record them on each call: harness mode, token in and token out.
    tokens: bool = False

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"the proxy's upstream must be an http(s) URL, got {self.base_url!r}")
        self.base_url = self.base_url.rstrip("/")

    @classmethod
    def from_model_config(cls, config: Any) -> Upstream:
        """From the SWE recipe's ``ModelConfig`` (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``ORCHARD_MODEL``)."""
        return cls(config.base_url, config.api_key, config.model, config.request_timeout)


@dataclass
class ProxySession:
    """One episode's access: its key, its budget and what it called."""

    label: str
    key: str = field(default_factory=lambda: "orchard-" + secrets.token_urlsafe(24))
    max_calls: int | None = None
    calls: list[ModelCall] = field(default_factory=list)
    opened: float = field(default_factory=time.monotonic)
    refused: int = 0  # calls past the budget


def _numbers(values: Any, kind: type) -> list[Any] | None:
    if not isinstance(values, list):
        return None
    try:
        return [kind(value) for value in values]
    except (TypeError, ValueError):
        return None


def record_tokens(call: ModelCall) -> None:
    """The ids and logprobs of a chat completion asked with ``return_token_ids`` and
    ``logprobs`` (vLLM's fields: ``prompt_token_ids`` on the reply, ``token_ids`` and
    ``logprobs.content[].logprob`` on its first choice), as arrays on ``call``; nothing when
    the backend did not give them all."""
    reply = call.response
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    prompt = _numbers(reply.get("prompt_token_ids", choice.get("prompt_token_ids")), int)
    sampled = _numbers(choice.get("token_ids"), int)
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    logprobs = _numbers([entry.get("logprob") for entry in content or [] if isinstance(entry, dict)], float)
    if prompt is None or sampled is None or logprobs is None or len(sampled) != len(logprobs):
        return
    call.prompt_ids, call.token_ids, call.logprobs = prompt, sampled, logprobs


def stitch_calls(calls: list[ModelCall]) -> list[TurnTokens | None]:
    """Each call's ``TurnTokens`` (None for a call without tokens): consecutive calls whose
    prompt extends the previous call's prompt and reply form one trainable sequence (a
    segment; a call then holds only the tokens added since); a call that rewrites the history
    (a compaction, a sub-agent's own conversation) starts a new segment with its whole prompt."""
    turns: list[TurnTokens | None] = []
    context: list[int] | None = None
    segment = -1
    for call in calls:
        if not call.token_ids and not call.prompt_ids:
            turns.append(None)
            continue
        if context is not None and call.prompt_ids[: len(context)] == context:
            added = call.prompt_ids[len(context) :]
        else:
            segment += 1
            added = call.prompt_ids
        finish = ""
        choices = call.response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            finish = str(choices[0].get("finish_reason") or "")
        turns.append(
            TurnTokens(
                segment=segment,
                prompt_ids=added,
                token_ids=call.token_ids,
                logprobs=call.logprobs,
                finish_reason=finish,
            )
        )
        context = call.prompt_ids + call.token_ids
    return turns


def usage_of(reply: Any) -> dict[str, int]:
    raw = reply.get("usage") if isinstance(reply, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {k: int(v) for k, v in raw.items() if k.endswith("_tokens") and isinstance(v, int | float)}


class StreamAssembler:
    """Puts ``chat.completion.chunk`` events back together into one ``chat.completion``."""

    def __init__(self) -> None:
        self.buffer = b""
        self.chunks = 0
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer:
            line, _, self.buffer = self.buffer.partition(b"\n")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            if isinstance(chunk, dict):
                self._chunk(chunk)

    def _chunk(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        if isinstance(chunk.get("prompt_token_ids"), list):  # return_token_ids: on the first chunk
            self.head["prompt_token_ids"] = chunk["prompt_token_ids"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            slot = self.choices.setdefault(index, {"index": index, "message": {"role": "assistant", "content": None}})
            message, delta = slot["message"], choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                message["content"] = (message["content"] or "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                calls = message.setdefault("tool_calls", [])
                position = call.get("index", len(calls))
                while len(calls) <= position:
                    calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                entry, function = calls[position], call.get("function") or {}
                entry["id"] = call.get("id") or entry["id"]
                entry["function"]["name"] += function.get("name") or ""
                entry["function"]["arguments"] += function.get("arguments") or ""
            if isinstance(choice.get("token_ids"), list):  # return_token_ids: each chunk's own ids
                slot.setdefault("token_ids", []).extend(choice["token_ids"])
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                slot.setdefault("logprobs", {"content": []})["content"].extend(logprobs["content"])
            if choice.get("finish_reason"):
                slot["finish_reason"] = choice["finish_reason"]

    def result(self) -> dict[str, Any]:
        reply = {**self.head, "object": "chat.completion", "choices": [self.choices[i] for i in sorted(self.choices)]}
        if self.usage is not None:
            reply["usage"] = self.usage
        return reply


class ModelProxy:
    """The proxy server. ``async with ModelProxy(upstream) as proxy:`` listens on
    ``proxy.port``; ``open_session`` / ``close_session`` bracket one episode."""

    def __init__(self, upstream: Upstream, *, host: str = "127.0.0.1"):
        self.upstream = upstream
        self.host = host
        self.port = 0
        self.sessions: dict[str, ProxySession] = {}
        self._runner: web.AppRunner | None = None
        self._client: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def open_session(self, label: str, *, max_calls: int | None = None) -> ProxySession:
        session = ProxySession(label, max_calls=max_calls)
        self.sessions[session.key] = session
        return session

    def close_session(self, session: ProxySession) -> list[ModelCall]:
        """Revoke the key (a harness left running can call no more) and return the calls."""
        self.sessions.pop(session.key, None)
        return sorted(session.calls, key=lambda call: call.index)

    async def start(self) -> ModelProxy:
        import aiohttp
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        timeout = aiohttp.ClientTimeout(total=self.upstream.timeout)
        self._client = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        return self

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ModelProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- handlers ------------------------------------------------------------------------

    def _session(self, request: web.Request) -> ProxySession | None:
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("api-key", "")
        return self.sessions.get(key)

    def _upstream_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.upstream.api_key:
            headers["Authorization"] = f"Bearer {self.upstream.api_key}"
        return headers

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        from aiohttp import web

        body = {"error": {"message": message, "type": "orchard_proxy", "code": status}}
        return web.json_response(body, status=status)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        if self._session(request) is None:
            return self._error(401, "unknown key: this proxy serves the key of a live episode only")
        if self.upstream.model:  # the one model a harness can ask for
            return web.json_response({"object": "list", "data": [{"id": self.upstream.model, "object": "model"}]})
        async with self._client.get(self.upstream.base_url + "/models", headers=self._upstream_headers()) as reply:
            return web.Response(status=reply.status, body=await reply.read(), content_type="application/json")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        import aiohttp
        from aiohttp import web

        session = self._session(request)
        if session is None:
            return self._error(401, "unknown key: this proxy serves the key of a live episode only")
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return self._error(400, "the request body must be a JSON object")
        if session.max_calls is not None and len(session.calls) >= session.max_calls:
            session.refused += 1
            return self._error(400, f"model call budget exhausted ({session.max_calls} calls): finish now")
        if self.upstream.model:
            body["model"] = self.upstream.model
        if self.upstream.tokens:
            body["logprobs"], body["return_token_ids"] = True, True
        index = len(session.calls)
        start = time.monotonic()
        call = ModelCall(
            index=index, path="/v1/chat/completions", started_s=start - session.opened, latency_s=0.0,
            status=0, request=body, stream=bool(body.get("stream")),
        )  # fmt: skip
        session.calls.append(call)  # claimed now: the budget counts calls in flight
        url = self.upstream.base_url + "/chat/completions"
        try:
            async with self._client.post(url, data=json.dumps(body), headers=self._upstream_headers()) as reply:
                call.status = reply.status
                is_sse = reply.headers.get("Content-Type", "").startswith("text/event-stream")
                if not (call.stream and is_sse and reply.status < 400):
                    data = await reply.read()
                    call.latency_s = time.monotonic() - start
                    try:
                        decoded = json.loads(data)
                    except ValueError:
                        decoded = {"unreadable": data[:2000].decode(errors="replace")}
                    call.response = decoded if isinstance(decoded, dict) else {"json": decoded}
                    call.usage = usage_of(call.response)
                    if self.upstream.tokens:
                        record_tokens(call)
                    content_type = reply.headers.get("Content-Type", "application/json")
                    return web.Response(status=reply.status, body=data, headers={"Content-Type": content_type})
                out = web.StreamResponse(status=reply.status, headers={"Content-Type": "text/event-stream"})
                await out.prepare(request)
                assembler = StreamAssembler()
                async for data in reply.content.iter_any():
                    if call.first_token_s is None:
                        call.first_token_s = time.monotonic() - start
                    assembler.feed(data)
                    await out.write(data)
                await out.write_eof()
                call.latency_s = time.monotonic() - start
                call.response, call.chunks = assembler.result(), assembler.chunks
                call.usage = usage_of(call.response)
                if self.upstream.tokens:
                    record_tokens(call)
                return out
        except (aiohttp.ClientError, TimeoutError) as exc:
            call.latency_s = time.monotonic() - start
            call.status, call.error = 502, f"{type(exc).__name__}: {exc}"
            return self._error(502, f"the upstream model failed: {call.error}")
        except ConnectionResetError as exc:  # the harness went away mid-stream
            call.latency_s = time.monotonic() - start
            call.error = f"the client disconnected: {exc}"
            raise


# -- into a sandbox: a listener on its loopback, carried over one stream ----------------------

OPEN, DATA, EOF, CLOSE = 0, 1, 2, 3
FRAME = struct.Struct(">IBI")

# `$1` the port to listen on (0: any). Says `PORT <n>` on its first line, then frames.
MUX_RELAY = r"""
import os, socket, struct, sys, threading
F = struct.Struct(">IBI")
lock = threading.Lock()
socks = {}
def out(cid, kind, data=b""):
    view = memoryview(F.pack(cid, kind, len(data)) + data)
    with lock:
        while view:
            view = view[os.write(1, view):]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(128)
os.write(1, ("PORT %d\n" % srv.getsockname()[1]).encode())
def pump(cid, s):
    try:
        while True:
            d = s.recv(262144)
            if not d:
                break
            out(cid, 1, d)
    except OSError:
        pass
    out(cid, 2)
def accept():
    n = 0
    while True:
        s, _ = srv.accept()
        n += 1
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks[n] = s
        out(n, 0)
        threading.Thread(target=pump, args=(n, s), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
buf = b""
def take(n):
    global buf
    while len(buf) < n:
        d = os.read(0, 262144)
        if not d:
            os._exit(0)
        buf += d
    part, buf = buf[:n], buf[n:]
    return part
while True:
    cid, kind, size = F.unpack(take(9))
    data = take(size) if size else b""
    s = socks.get(cid)
    if s is None:
        continue
    try:
        if kind == 1:
            s.sendall(data)
        elif kind == 2:
            s.shutdown(socket.SHUT_WR)
        elif kind == 3:
            socks.pop(cid, None)
            s.close()
    except OSError:
        pass
"""


class _Frames:
    """Reads ``FRAME``s (and the first line) off a byte stream."""

    def __init__(self, stream: anyio.abc.ByteStream):
        self.stream = stream
        self.buffer = b""

    async def _fill(self, size: int) -> None:
        while len(self.buffer) < size:
            self.buffer += await self.stream.receive()

    async def line(self) -> bytes:
        while b"\n" not in self.buffer:
            if len(self.buffer) > 4096:
                raise ConnectionError(f"the relay said {self.buffer[:80]!r}")
            self.buffer += await self.stream.receive()
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    async def frame(self) -> tuple[int, int, bytes]:
        await self._fill(FRAME.size)
        cid, kind, size = FRAME.unpack(self.buffer[: FRAME.size])
        await self._fill(FRAME.size + size)
        data = self.buffer[FRAME.size : FRAME.size + size]
        self.buffer = self.buffer[FRAME.size + size :]
        return cid, kind, data


@asynccontextmanager
async def serve_into(sandbox: Sandbox, port: int, *, sandbox_port: int = 0) -> AsyncIterator[int]:
    """Make ``127.0.0.1:port`` of the controller reachable inside ``sandbox`` as
    ``127.0.0.1:<yielded port>`` (``sandbox_port``, or a free one), over one stream; the
    sandbox's network stays off. Needs python3 in the image."""
    stream = await sandbox.open_stream(["python3", "-I", "-S", "-c", MUX_RELAY, str(sandbox_port)])
    frames = _Frames(stream)
    send_lock = anyio.Lock()
    connections: dict[int, anyio.abc.SocketStream] = {}

    async def send(cid: int, kind: int, data: bytes = b"") -> None:
        async with send_lock:
            await stream.send(FRAME.pack(cid, kind, len(data)) + data)

    async def carry_back(cid: int, local: anyio.abc.SocketStream) -> None:
        """The controller's side of one connection back into the sandbox, then close it."""
        try:
            async for chunk in local:
                await send(cid, DATA, chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            connections.pop(cid, None)
            await local.aclose()
            with anyio.CancelScope(shield=True):
                try:
                    await send(cid, CLOSE)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass

    async def demux(group: anyio.abc.TaskGroup) -> None:
        try:
            while True:
                cid, kind, data = await frames.frame()
                if kind == OPEN:
                    try:
                        local = await anyio.connect_tcp("127.0.0.1", port)
                    except OSError:
                        await send(cid, CLOSE)
                        continue
                    connections[cid] = local
                    group.start_soon(carry_back, cid, local)
                    continue
                local = connections.get(cid)
                if local is None:
                    continue
                try:
                    if kind == DATA:
                        await local.send(data)
                    elif kind == EOF:
                        await local.send_eof()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the relay ended (its sandbox is going away)

    async with stream:
        try:
            with anyio.fail_after(START_TIMEOUT):
                line = (await frames.line()).decode(errors="replace")
        except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            raise ConnectionError(f"the model relay in {sandbox.id} did not start ({exc!r})") from None
        if not line.startswith("PORT "):
            raise ConnectionError(f"the model relay in {sandbox.id} failed: {line[:300]}")
        async with anyio.create_task_group() as group:
            group.start_soon(demux, group)
            try:
                yield int(line.split()[1])
            finally:
                group.cancel_scope.cancel()
                for local in list(connections.values()):
                    await local.aclose()
