"""Load test of ``orchard-async serve``: many sandboxes through the service, a ``kill -9`` in the middle.

    /work/venv/bin/python scripts/service-load.py --adapter local --sandboxes 200 --commands 10 \
        --concurrency 32 [--kill-at 0.4]

Starts the service in its own process (a fresh local root, or docker), then runs one
"episode" per sandbox through the remote adapter: create, ``--commands`` commands whose
output is checked byte for byte, delete. With ``--kill-at F`` the service is SIGKILLed once
a fraction F of all commands are done and started again on the same port; an episode whose
sandbox is lost or whose create fails starts over on a new sandbox (what a trainer does).

Reports one JSON object: commands right / wrong (a wrong result is one that came back
``ok`` with output other than its own: it must be 0), errors the client saw by kind
(retryable ones: connection refused, 503, the sandbox lost to the restart), the sandboxes
live at the kill and what the restarted service reaped, and the leak check: sandboxes the
service still lists, sandbox dirs / processes (local) or containers (docker) left once
everything is deleted and once the service has stopped.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

import orchard_async as oa

SERVE = [str(Path(sys.executable).with_name("orchard-async")), "serve"]
IMAGE = "orchard/busybox:test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServiceProcess:
    """``orchard-async serve`` in a child process, logging to a file."""

    def __init__(self, adapter: str, options: dict, port: int, log: Path):
        self.adapter, self.options, self.port, self.log = adapter, options, port, log
        self.process: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        command = [*SERVE, "--adapter", self.adapter, "--port", str(self.port), "--idle-timeout", "0"]
        if self.options:
            command += ["--adapter-options", json.dumps(self.options)]
        with self.log.open("a") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    async def ready(self, within: float = 120.0) -> float:
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            while time.monotonic() - started < within:
                if self.process.poll() is not None:
                    raise SystemExit(f"the service exited with {self.process.returncode}; see {self.log}")
                try:
                    if (await http.get("/health")).status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)
        raise SystemExit(f"the service did not answer within {within}s; see {self.log}")

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


class Load:
    def __init__(self, args: argparse.Namespace, service: ServiceProcess, root: Path | None):
        self.args = args
        self.root = root
        self.service = service
        self.total = args.sandboxes * args.commands
        self.right = 0
        self.wrong: list[str] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.episodes_done = 0
        self.episodes_failed = 0
        self.restarts_of_episodes = 0
        self.live: set[str] = set()  # sandboxes the client holds right now
        self.live_at_kill: int | None = None
        self.killed = anyio.Event()
        self.restart_s: float | None = None
        self.backend_after_kill: dict | None = None  # sandboxes in the backend just after the kill
        self.backend_after_restart: dict | None = None  # and once the restarted service answers

    async def episode(self, adapter: oa.Adapter, number: int) -> None:
        for attempt in range(self.args.episode_attempts):
            if attempt:
                self.restarts_of_episodes += 1
                await anyio.sleep(1.0)
            try:
                sandbox = await adapter.create(oa.SandboxSpec(image=IMAGE, ttl=600))
            except oa.CreateFailed as exc:
                self.errors["create_failed: " + kind_of(str(exc))] += 1
                continue
            self.live.add(sandbox.id)
            try:
                lost = await self.commands(sandbox, number)
            finally:
                self.live.discard(sandbox.id)
                try:
                    await sandbox.close()
                except oa.InfraError as exc:
                    self.errors["delete: " + kind_of(str(exc))] += 1
            if not lost:
                self.episodes_done += 1
                return
        self.episodes_failed += 1

    async def commands(self, sandbox: oa.Sandbox, number: int) -> bool:
        """Run the episode's commands; True when the sandbox went away under them."""
        for index in range(self.args.commands):
            token = f"{number}-{index}-{sandbox.id}"
            result = await sandbox.exec(f"echo {token}; echo $(({number} * 1000 + {index})) >&2")
            if result.reason is oa.ExitReason.OK:
                if result.stdout != f"{token}\n".encode() or result.stderr != f"{number * 1000 + index}\n".encode():
                    self.wrong.append(f"{token}: {result.stdout[:80]!r} {result.stderr[:80]!r}")
                else:
                    self.right += 1
                    await self.maybe_kill()
                continue
            self.errors[f"exec {result.reason}: " + kind_of(result.error_text)] += 1
            return True
        return False

    async def maybe_kill(self) -> None:
        if self.args.kill_at is None or self.killed.is_set() or self.right < self.args.kill_at * self.total:
            return
        self.killed.set()
        self.live_at_kill = len(self.live)
        self.service.kill9()
        self.backend_after_kill = await anyio.to_thread.run_sync(backend_leaks, self.args.adapter, self.root)
        print(f"kill -9 at {self.right} commands, {self.live_at_kill} sandboxes live", file=sys.stderr)
        await anyio.sleep(self.args.down_for)
        self.service.start()
        self.restart_s = await self.service.ready()
        self.backend_after_restart = await anyio.to_thread.run_sync(backend_leaks, self.args.adapter, self.root)


def kind_of(message: str) -> str:
    """An error message, shortened to its kind (for counting)."""
    for kind in ("ConnectError", "RemoteProtocolError", "ReadError", "503", "not found", "did not answer"):
        if kind in message:
            return kind
    return message.splitlines()[0][:80] if message else "?"


async def leaks(service: ServiceProcess, adapter: str, root: Path | None) -> dict:
    found: dict = {}
    if service.process.poll() is None:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
            found["service_lists"] = len((await http.get("/sandboxes")).json()["sandboxes"])
    found.update(await anyio.to_thread.run_sync(backend_leaks, adapter, root))
    return found


def backend_leaks(adapter: str, root: Path | None) -> dict:
    if adapter == "local":
        dirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        return {"sandbox_dirs": dirs, "sandbox_processes": sandbox_processes(root)}
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=orchard.serve.id"], capture_output=True, text=True, check=True
    )
    return {"containers": len(out.stdout.split())}


def summary(found: dict | None) -> dict | None:
    """Counts, not names."""
    if found is None:
        return None
    return {name: len(value) if isinstance(value, list) else value for name, value in found.items()}


def sandbox_processes(root: Path) -> int:
    """Processes whose environment names a sandbox dir under ``root``."""
    needle = f"ORCHARD_SANDBOX={root}/".encode()
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if needle in Path(f"/proc/{pid}/environ").read_bytes():
                    count += 1
            except OSError:
                pass
    return count


async def settle(service: ServiceProcess, adapter: str, root: Path | None, within: float = 30.0) -> dict:
    """The leak check, repeated until clean or ``within`` seconds pass (teardown runs in the background)."""
    deadline = time.monotonic() + within
    while True:
        found = await leaks(service, adapter, root)
        clean = not any(found.values())
        if clean or time.monotonic() > deadline:
            return found
        await anyio.sleep(1.0)


async def main(args: argparse.Namespace) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="service-load-"))
    root = scratch / "sandboxes" if args.adapter == "local" else None
    options = {"root": str(root)} if root else {}
    if root:
        root.mkdir()
    service = ServiceProcess(args.adapter, options, free_port(), scratch / "serve.log")
    service.start()
    await service.ready()
    load = Load(args, service, root)
    adapter = oa.get_adapter("remote", url=service.url)
    started = time.monotonic()
    limiter = anyio.Semaphore(args.concurrency)

    async def one(number: int) -> None:
        async with limiter:
            await load.episode(adapter, number)

    try:
        async with anyio.create_task_group() as tg:
            for number in range(args.sandboxes):
                tg.start_soon(one, number)
    except BaseException:
        service.stop()  # not left running behind a failed run (it deletes its sandboxes)
        raise
    elapsed = time.monotonic() - started
    await adapter.close()
    while_running = await settle(service, args.adapter, root)
    stopped_rc = service.stop()
    after_stop = await settle(service, args.adapter, root)
    log = (scratch / "serve.log").read_text()
    return {
        "adapter": args.adapter,
        "sandboxes": args.sandboxes,
        "commands_each": args.commands,
        "concurrency": args.concurrency,
        "elapsed_s": round(elapsed, 1),
        "commands_right": load.right,
        "commands_wrong": len(load.wrong),
        "wrong_examples": load.wrong[:5],
        "episodes_done": load.episodes_done,
        "episodes_failed": load.episodes_failed,
        "episodes_restarted": load.restarts_of_episodes,
        "client_errors": dict(load.errors),
        "killed": load.killed.is_set(),
        "live_at_kill": load.live_at_kill,
        "restart_to_healthy_s": None if load.restart_s is None else round(load.restart_s, 2),
        "backend_just_after_kill": summary(load.backend_after_kill),
        "backend_when_restarted": summary(load.backend_after_restart),
        "reaped_at_restart": log.count("left by a run that is gone"),
        "readopted_at_restart": log.count("re-adopted key="),
        "lost_at_restart": log.count("could not re-adopt"),
        "leaks_service_running": while_running,
        "leaks_after_stop": after_stop,
        "service_exit_code": stopped_rc,
        "service_log": str(scratch / "serve.log"),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default="local", choices=["local", "docker"])
    parser.add_argument("--sandboxes", type=int, default=200)
    parser.add_argument("--commands", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kill-at", type=float, help="SIGKILL the service once this fraction of commands is done")
    parser.add_argument("--down-for", type=float, default=1.0, help="seconds between the kill and the restart")
    parser.add_argument("--episode-attempts", type=int, default=10)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(anyio.run(main, parse()), indent=2))
