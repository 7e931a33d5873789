"""Load on ``orchard-async serve``: many sandboxes through the service, a ``kill -9`` in the middle.

    python -m orchard_async.bench.service_load --adapter local --sandboxes 200 --commands 10 \\
        --concurrency 32 [--kill-at 0.4] [--json FILE]

Starts the service in its own process (a fresh local root, or docker), then runs one
"episode" per sandbox through the remote adapter: create, ``--commands`` commands whose
output is checked byte for byte, delete. With ``--kill-at F`` the service is SIGKILLed once
a fraction F of all commands are done and started again on the same port with the same
``--name``; an episode whose sandbox is lost or whose command's outcome the restart made
unknown starts over on a new sandbox (what a trainer does).

Reports one JSON object: commands right / wrong (a wrong result is one that came back
``ok`` with output other than its own: it must be 0), errors the client saw by kind (all
must be retryable: the service did not answer, 503, the sandbox or the command's outcome
lost to the restart), the sandboxes live at the kill and what became of them (docker:
re-adopted or lost; local: reaped, and what each of their ids answers now), and the leak
check: sandboxes the service still lists, sandbox dirs and processes (local) or containers
(docker) left once everything is deleted and once the service has stopped. The service runs
without an idle limit (``--idle-timeout 0``), so nothing it reaps on its own hides a leak.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx

import orchard_async as oa
from orchard_async.bench.service import IMAGE, ServiceProcess, free_port
from orchard_async.kit import procfs


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
        self.ids_at_kill: list[str] = []
        self.killed = anyio.Event()
        self.restart_s: float | None = None
        self.backend_after_kill: dict | None = None  # sandboxes in the backend just after the kill
        self.backend_before_restart: dict | None = None  # and when the service starts again
        self.answers_after_restart: collections.Counter[str] = collections.Counter()

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
        self.ids_at_kill = sorted(self.live)
        self.service.kill9()
        self.backend_after_kill = await anyio.to_thread.run_sync(backend_leaks, self.service.name, self.root)
        print(f"kill -9 at {self.right} commands, {len(self.ids_at_kill)} sandboxes live", file=sys.stderr)
        await anyio.sleep(self.args.down_for)
        # Counted before the start: once the restarted service answers, the clients create again.
        self.backend_before_restart = await anyio.to_thread.run_sync(backend_leaks, self.service.name, self.root)
        self.service.start()
        self.restart_s = await self.service.ready()
        await self.ask_after_restart()

    async def ask_after_restart(self) -> None:
        """What the restarted service answers for each sandbox the clients held at the kill
        (``GET /sandboxes/{id}``, retried while it answers 503 re-adopting): docker ``200
        ready`` (re-adopted); local ``404 sandbox_lost`` (a clear error, never a stale sandbox)."""
        async with httpx.AsyncClient(base_url=self.service.url, timeout=60) as http:
            for sandbox_id in self.ids_at_kill:
                for _ in range(120):
                    answer = await http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60})
                    if answer.status_code != 503:
                        break
                    await anyio.sleep(0.5)
                body = answer.json()
                said = body.get("status") if answer.status_code == 200 else body.get("reason")
                self.answers_after_restart[f"{answer.status_code} {said}"] += 1


def kind_of(message: str) -> str:
    """An error message, shortened to its kind (for counting)."""
    kinds = ("lost when the service restarted", "service restarted", "did not answer", "503", "not found")
    for kind in kinds:
        if kind in message:
            return kind
    return message.splitlines()[0][:80] if message else "?"


# What a trainer retries: the service did not answer or was restarting (503), the sandbox was
# lost (its episode starts over), the restart made a command's outcome unknown.
RETRYABLE = ("service restarted", "did not answer", "503", "sandbox_lost", "infra_error")


async def leaks(service: ServiceProcess, root: Path | None) -> dict:
    found: dict = {}
    if service.process.poll() is None:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
            found["service_lists"] = len((await http.get("/sandboxes")).json()["sandboxes"])
    found.update(await anyio.to_thread.run_sync(backend_leaks, service.name, root))
    return found


def backend_leaks(name: str, root: Path | None) -> dict:
    """What the backend holds of this service: local sandbox dirs and their processes, or the
    containers labelled with the service's name (other services' containers are not ours)."""
    if root is not None:
        dirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        return {"sandbox_dirs": len(dirs), "sandbox_processes": sandbox_processes(root)}
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=orchard.serve.name={name}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {"containers": len(out.stdout.split())}


def sandbox_processes(root: Path) -> int:
    """Processes whose environment names a sandbox dir under ``root``."""
    needle = f"ORCHARD_SANDBOX={root}/".encode()
    return sum(needle in environ for _, environ in procfs.environs())


async def settle(service: ServiceProcess, root: Path | None, within: float = 90.0) -> dict:
    """The leak check, repeated until clean or ``within`` seconds pass (teardown runs in the
    background; what the killed service was half-way through making goes at the restarted
    one's second reap, app.SECOND_REAP_AFTER after its start)."""
    deadline = time.monotonic() + within
    while True:
        found = await leaks(service, root)
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        await anyio.sleep(1.0)


async def run_load(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="service-load-"))
    root = scratch / "sandboxes" if args.adapter == "local" else None
    options = {"root": str(root)} if root else {}
    if root:
        root.mkdir()
    name = f"load-{uuid.uuid4().hex[:10]}"
    service = ServiceProcess(args.adapter, options, scratch / "serve.log", free_port(), name=name)
    service.start()
    await service.ready()
    load = Load(args, service, root)
    adapter = oa.get_adapter("remote", url=service.url, retry_for=args.retry_for)
    load_before = os.getloadavg()[0]
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
    load_after = os.getloadavg()[0]
    await adapter.close()
    while_running = await settle(service, root)
    stopped_rc = service.stop()
    after_stop = await settle(service, root)
    log = service.log.read_text()
    errors = dict(load.errors)
    return {
        "adapter": args.adapter,
        "sandboxes": args.sandboxes,
        "commands_each": args.commands,
        "concurrency": args.concurrency,
        "elapsed_s": round(elapsed, 1),
        "load_average_1m": [round(load_before, 1), round(load_after, 1)],
        "commands_right": load.right,
        "commands_wrong": len(load.wrong),
        "wrong_examples": load.wrong[:5],
        "episodes_done": load.episodes_done,
        "episodes_failed": load.episodes_failed,
        "episodes_restarted": load.restarts_of_episodes,
        "client_errors": errors,
        "client_errors_not_retryable": {k: v for k, v in errors.items() if not any(r in k for r in RETRYABLE)},
        "killed": load.killed.is_set(),
        "live_at_kill": len(load.ids_at_kill),
        "restart_to_healthy_s": None if load.restart_s is None else round(load.restart_s, 2),
        "backend_just_after_kill": load.backend_after_kill,
        "backend_before_restart": load.backend_before_restart,
        "answers_after_restart": dict(load.answers_after_restart),
        "found_at_restart": sum(int(n) for n in re.findall(r"re-adopting (\d+) sandboxes", log)),
        "reaped_at_restart": log.count("left by a run that is gone"),
        "readopted_at_restart": log.count("re-adopted key="),
        "lost_at_restart": log.count("could not re-adopt"),
        "removed_at_restart": len(re.findall(r"removing \S+: key ", log)),
        "leaks_service_running": while_running,
        "leaks_after_stop": after_stop,
        "service_exit_code": stopped_rc,
        "service_log": str(service.log),
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
    parser.add_argument("--retry-for", type=float, default=60.0, help="the remote adapter's retry_for (s)")
    parser.add_argument("--json", dest="json_out", help="write the result here too")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = oa.run(run_load, args)
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
