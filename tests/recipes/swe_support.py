"""Support for the SWE recipe tests: a scripted OpenAI-compatible HTTP server, rollouts on a
private local-adapter root (so "nothing left behind" is checked exactly), scripted policies."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter

REASONS = {
    200: "OK",
    400: "Bad Request",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON; bytes/str as they are
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def chat_reply(content: str, *, prompt_tokens: int = 100, completion_tokens: int = 20) -> Reply:
    return Reply(
        body={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


class ScriptedChatServer:
    """A real HTTP/1.1 server (asyncio streams, keep-alive) on 127.0.0.1, in its own thread
    and event loop, answering POST /v1/chat/completions with ``handler(request, index)``."""

    def __init__(self, handler: Callable[[dict[str, Any], int], Reply]):
        self.handler = handler
        self.requests: list[dict[str, Any]] = []  # {"path", "headers", "json"}
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedChatServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the scripted chat server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                with self._lock:
                    index = len(self.requests)
                    request = {"method": method, "path": path, "headers": headers, "json": json.loads(body or b"null")}
                    self.requests.append(request)
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    if path != "/v1/chat/completions" or method != "POST":
                        reply = Reply(404, {"error": f"no route {method} {path}"})
                    else:
                        reply = self.handler(request["json"], index)
                    if reply.delay:
                        await asyncio.sleep(reply.delay)
                finally:
                    with self._lock:
                        self.in_flight -= 1
                data = (
                    reply.body
                    if isinstance(reply.body, bytes)
                    else (reply.body.encode() if isinstance(reply.body, str) else json.dumps(reply.body).encode())
                )
                extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
                writer.write(
                    (
                        f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, 'Status')}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
                    ).encode()
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def assistant_turns(request: dict[str, Any]) -> int:
    return sum(message["role"] == "assistant" for message in request["messages"])


# -- rollouts on a private root ---------------------------------------------------------------


def failed_steps(trajectory: oa.Trajectory) -> list[str]:
    """The commands of an episode that did not exit 0, and the GUI actions the driver refused."""
    failed = [
        f"step {step.index} exit {step.exit_code}: {step.action.command[:120]!r} -> {step.observation[-160:]!r}"
        for step in trajectory.steps
        if step.action.kind == "exec" and step.exit_code != 0
    ]
    if trajectory.info.get("action_errors"):
        failed.append(f"{trajectory.info['action_errors']} action(s) the browser driver refused")
    return failed


@dataclass
class RunResult:
    trajectories: list[oa.Trajectory]
    leaked: list[str]  # ids the adapter still owned
    left_on_disk: list[str]  # entries left under the adapter's root
    wall_s: float

    def by_task(self) -> dict[str, oa.Trajectory]:
        return {t.task_id: t for t in self.trajectories}


async def run_rollout(
    tasks: Sequence[Any], policy: Any, root: Path, *, n: int | None = None, group_size: int = 1, concurrency: int = 2
) -> RunResult:
    adapter = LocalAdapter(root=root)
    found: list[oa.Trajectory] = []
    started = time.perf_counter()
    try:
        async for trajectory in oa.rollout(tasks, policy, adapter, n=n, group_size=group_size, concurrency=concurrency):
            found.append(trajectory)
    finally:
        leaked = await adapter.list_owned()
        await adapter.close()
    wall = time.perf_counter() - started
    left = await anyio.to_thread.run_sync(lambda: sorted(p.name for p in root.iterdir()) if root.exists() else [])
    found.sort(key=lambda t: t.episode_id)
    return RunResult(found, leaked, left, wall)


async def side_by_side(**runs: Callable[[], Awaitable[RunResult]]) -> dict[str, RunResult]:
    """Several rollouts at once (each on its own adapter root), by name."""
    results: dict[str, RunResult] = {}

    async def one(name: str) -> None:
        results[name] = await runs[name]()

    async with anyio.create_task_group() as group:
        for name in runs:
            group.start_soon(one, name)
    return {name: results[name] for name in runs}


class ScriptPolicy:
    """Runs fixed commands (per task id, or the same for all), then submits."""

    def __init__(self, commands: dict[str, list[str]] | list[str], name: str = "script"):
        self.commands = commands
        self.name = name

    async def act(self, observation: oa.Observation) -> oa.Action:
        script = self.commands if isinstance(self.commands, list) else self.commands.get(observation.task.id, [])
        if observation.step < len(script):
            return oa.Action(command=script[observation.step])
        return oa.Action(kind="submit")
