"""What the service costs: exec round trip and create/delete rate, through ``serve`` and in-process, in one run.

    orchard-async bench service [--adapter local] [--ops 400] [--levels 1/1,64/64,64/8]
                                [--compare-plain] [--clients] [--json FILE] [--markdown FILE]

One service (``orchard-async serve``, its own process, on loopback) and one in-process adapter of
the same kind, side by side. For each level ``C/S`` (C callers over S sandboxes; a sandbox's
shell runs one command at a time, so C > S queues) it measures ``true`` round trips:

* ``in-process``: ``sandbox.exec`` on the adapter in this process;
* ``service, Orchard HTTP``: the Orchard client's request (``POST /exec`` with ``wait: true``)
  on a raw HTTP client;
* ``remote adapter``: ``sandbox.exec`` of ``get_adapter("remote")`` (native mode).

``--compare-plain`` starts a second service with bash lanes off (``ORCHARD_SERVE_BASH_LANE=0``:
each Orchard command a new bash process, serve/lane.py) and adds its Orchard request as
``service, Orchard HTTP, no bash lane``; every way then runs in 8 slices taken in turns, so the
machine's load falls on all alike.

Then sandboxes created and deleted per second, in-process and through the remote adapter.
``--clients`` first times ``GET /health`` with httpx and with aiohttp (the client's own cost).

``--exposed`` measures instead what an exposed port costs (issue 27): a keep-alive HTTP server
(1 KiB answers) in a sandbox of the service (``serve --services``) and one in an in-process
sandbox, each asked ``GET /`` directly at its own address (network on, so that a direct way
exists) and through its exposed URL: the service's ``/s/{token}/`` and ``sandbox.expose``. The
ways take turns in slices, at 1 and 16 callers, so the machine's load falls on all alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx

import orchard_async as oa
from orchard_async.apps.cli import parse_adapter_options
from orchard_async.capabilities import Exposes
from orchard_async.records.paths import check_output_file

IMAGE = "orchard/busybox:test"
EXPOSED_IMAGE = "orchard/python:test"  # --exposed: its server needs python3
EXPOSED_PORT = 8080
# --exposed: an HTTP/1.1 keep-alive server, as a service in a sandbox is (http.server alone
# answers HTTP/1.0 and closes every connection: each request would time a new relay instead)
KEEPALIVE_SERVER = r"""
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        body = b"x" * 1024
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *_):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""
ORCHARD_EXEC = {"command": "true", "timeout_seconds": None, "cwd": None, "env": None, "login_shell": False}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServiceProcess:
    """``orchard-async serve`` in a child process (its log in a file). ``start`` again after
    ``kill9`` restarts it on the same port with the same ``--name`` (so it re-adopts)."""

    def __init__(
        self,
        adapter: str,
        options: dict[str, Any],
        log: Path,
        port: int | None = None,
        *,
        name: str | None = None,
        idle_timeout: float = 0.0,
        env: dict[str, str] | None = None,
        flags: tuple[str, ...] = (),
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name or f"bench-{self.port}"
        command = [str(Path(sys.executable).with_name("orchard-async")), "serve", "--adapter", adapter]
        command += ["--port", str(self.port), "--idle-timeout", f"{idle_timeout:g}", "--name", self.name]
        if options:
            command += ["--adapter-options", json.dumps(options)]
        self.command, self.log = command + list(flags), log
        self.env = {**os.environ, **env} if env else None
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env)

    async def ready(self, within: float = 120.0) -> float:
        """Seconds until ``/health`` answers."""
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            while time.monotonic() - started < within:
                if self.process.poll() is not None:
                    raise oa.ConfigError(f"the service exited with {self.process.returncode}; see {self.log}")
                try:
                    if (await http.get("/health")).status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)
        raise oa.ConfigError(f"the service did not answer within {within:g}s; see {self.log}")

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50_ms": round(pick(0.50) * 1000, 2),
        "p99_ms": round(pick(0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


async def round_trips(calls: list[Callable[[], Awaitable[None]]], callers: int, ops: int) -> tuple[list[float], float]:
    """``ops`` calls by ``callers`` concurrent callers; caller i uses ``calls[i % len(calls)]``."""
    latencies: list[float] = []
    per_caller = max(1, ops // callers)

    async def caller(index: int) -> None:
        call = calls[index % len(calls)]
        for _ in range(per_caller):
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for index in range(callers):
            tg.start_soon(caller, index)
    return latencies, time.perf_counter() - started


# What the service runs for Orchard's request of `true` (jobs.orchard_script: a bash process),
# run in-process too, so the Orchard row has a baseline that spawns what it spawns.
ORCHARD_SCRIPT_OF_TRUE = "if command -v bash >/dev/null 2>&1; then exec bash -c true; else exec sh -c true; fi"


def checked_exec(sandbox: Any, command: str = "true") -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = await sandbox.exec(command)
        if result.reason is not oa.ExitReason.OK:
            raise RuntimeError(f"exec failed: {result.reason} {result.error_text[:200]}")

    return call


def orchard_exec(http: aiohttp.ClientSession, url: str, sandbox_id: str) -> Callable[[], Awaitable[None]]:
    """Orchard's async client's request (it is aiohttp too)."""

    async def call() -> None:
        async with http.post(f"{url}/sandboxes/{sandbox_id}/exec", json={**ORCHARD_EXEC, "wait": True}) as response:
            body = await response.json()
        if response.status != 200 or body["status"] != "succeeded":
            raise RuntimeError(f"exec through the service failed: {response.status} {str(body)[:200]}")

    return call


async def create_delete_rate(adapter: oa.Adapter, count: int, concurrency: int) -> dict[str, float]:
    limiter = anyio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with limiter:
            started = time.perf_counter()
            sandbox = await adapter.create(oa.SandboxSpec(image=IMAGE, ttl=600))
            await sandbox.close()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    elapsed = time.perf_counter() - started
    return {"per_s": round(count / elapsed, 1), **percentiles(latencies)}


async def probe_clients(url: str, ops: int, callers_levels: tuple[int, ...] = (1, 64)) -> list[dict[str, Any]]:
    """``GET /health`` (no sandbox involved) with httpx and with aiohttp: what the HTTP client
    itself costs at each concurrency (docs/performance.md, "The service's overhead": httpx's pool at 64 callers)."""
    rows: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with (
        httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as with_httpx,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as with_aiohttp,
    ):

        async def httpx_health() -> None:
            if (await with_httpx.get("/health")).status_code != 200:
                raise RuntimeError("GET /health failed")

        async def aiohttp_health() -> None:
            async with with_aiohttp.get(f"{url}/health") as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError("GET /health failed")

        for client, call in (("httpx", httpx_health), ("aiohttp", aiohttp_health)):
            for callers in callers_levels:
                await round_trips([call], callers, min(ops, callers * 5))
                latencies, elapsed = await round_trips([call], callers, ops)
                row = {"client": client, "callers": callers, "ops": len(latencies)}
                rows.append({**row, **percentiles(latencies), "ops_per_s": round(len(latencies) / elapsed)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    options = json.loads(args.adapter_options) if args.adapter_options else {}
    if args.adapter == "local" and "root" not in options:
        options["root"] = str(scratch / "service-sandboxes")
    service = ServiceProcess(args.adapter, options, scratch / "serve.log")
    service.start()
    await service.ready()
    # The same service with Orchard commands as a new bash process each (no bash lane: lane.py).
    plain = None
    if args.compare_plain:
        plain_options = {**options, "root": str(scratch / "plain-sandboxes")} if args.adapter == "local" else options
        plain = ServiceProcess(args.adapter, plain_options, scratch / "plain.log", env={"ORCHARD_SERVE_BASH_LANE": "0"})
        plain.start()
        await plain.ready()
    in_process_options = {**options, "root": str(scratch / "own-sandboxes")} if args.adapter == "local" else options
    local = oa.get_adapter(args.adapter, **in_process_options)
    remote = oa.get_adapter("remote", url=service.url, max_connections=args.max_connections)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.max_connections))
    rows: list[dict[str, Any]] = []
    clients: list[dict[str, Any]] = []
    try:
        if args.clients:
            clients = await probe_clients(service.url, args.ops)
        most = max(s for _, s in args.levels)
        spec = oa.SandboxSpec(image=IMAGE, ttl=3600)
        own = [await local.create(spec) for _ in range(most)]
        far = [await remote.create(spec) for _ in range(most)]
        plain_remote = oa.get_adapter("remote", url=plain.url) if plain else None
        plain_far = [await plain_remote.create(spec) for _ in range(most)] if plain_remote else []
        for callers, sandboxes in args.levels:
            ways = {
                "in-process": [checked_exec(s) for s in own[:sandboxes]],
                "in-process, Orchard's bash -c": [checked_exec(s, ORCHARD_SCRIPT_OF_TRUE) for s in own[:sandboxes]],
                "service, Orchard HTTP": [orchard_exec(http, service.url, s.id) for s in far[:sandboxes]],
                "remote adapter (native)": [checked_exec(s) for s in far[:sandboxes]],
            }
            if plain:
                plain_calls = [orchard_exec(http, plain.url, s.id) for s in plain_far[:sandboxes]]
                ways["service, Orchard HTTP, no bash lane"] = plain_calls
            for calls in ways.values():
                await round_trips(calls, callers, min(args.ops, callers * 5))  # warm up connections
            if plain:
                # The lane and the plain way in alternating slices of the same minutes, so the
                # machine's load falls on both alike.
                await alternate(ways, rows, callers, sandboxes, args.ops)
                continue
            for way, calls in ways.items():
                latencies, elapsed = await round_trips(calls, callers, args.ops)
                row = {"way": way, "callers": callers, "sandboxes": sandboxes, "ops": len(latencies)}
                rows.append({**row, **percentiles(latencies), "ops_per_s": round(len(latencies) / elapsed)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for sandbox in own:
            await sandbox.close()
        for sandbox in far + plain_far:
            await sandbox.close()
        if plain_remote:
            await plain_remote.close()
        rates = {
            "in-process": await create_delete_rate(local, args.creates, args.create_concurrency),
            "remote adapter": await create_delete_rate(remote, args.creates, args.create_concurrency),
        }
    finally:
        await http.close()
        await remote.close()
        await local.close()
        service.stop()
        if plain:
            plain.stop()
    return {
        "adapter": args.adapter,
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "exec": rows,
        "clients": clients,
        "create_delete": {"count": args.creates, "concurrency": args.create_concurrency, **rates},
    }


async def start_keepalive_server(sandbox: Any) -> None:
    await sandbox.write_file("keepalive_server.py", KEEPALIVE_SERVER)
    started = await sandbox.exec(f"nohup python3 keepalive_server.py {EXPOSED_PORT} >server.log 2>&1 &", timeout=30)
    if not started.ok:
        raise RuntimeError(f"the bench's HTTP server did not start in {sandbox.id}: {started.error_text[:200]}")


async def direct_url(sandbox: Any, adapter: str) -> str:
    """The server's own address from here: the host's loopback for a local sandbox with
    network (it shares the host's), else the sandbox's address."""
    if adapter == "local":
        return f"http://127.0.0.1:{EXPOSED_PORT}"
    found = await sandbox.exec("hostname -i", timeout=30)
    address = found.text.split()[0] if found.ok and found.text.split() else ""
    if not address:
        raise RuntimeError(f"no address for {sandbox.id}: {found.error_text[:200]}")
    return f"http://{address}:{EXPOSED_PORT}"


def http_get(http: aiohttp.ClientSession, url: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        async with http.get(url) as response:
            body = await response.read()
        if response.status != 200 or len(body) != 1024:
            raise RuntimeError(f"GET {url.split('/s/')[0]} answered {response.status}, {len(body)} bytes")

    return call


async def answering(http: aiohttp.ClientSession, url: str, within: float = 60.0) -> None:
    with anyio.fail_after(within):
        while True:
            try:
                await http_get(http, url)()
                return
            except (aiohttp.ClientError, RuntimeError):
                await anyio.sleep(0.1)


async def measure_exposed(args: argparse.Namespace) -> dict[str, Any]:
    """``--exposed``: a request through an exposed URL vs to the same server directly."""
    scratch = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    options = json.loads(args.adapter_options) if args.adapter_options else {}
    if args.adapter == "local" and "root" not in options:
        options["root"] = str(scratch / "service-sandboxes")
    service = ServiceProcess(args.adapter, options, scratch / "serve.log", flags=("--services",))
    service.start()
    await service.ready()
    in_process_options = {**options, "root": str(scratch / "own-sandboxes")} if args.adapter == "local" else options
    local = oa.get_adapter(args.adapter, **in_process_options)
    remote = oa.get_adapter("remote", url=service.url)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.max_connections))
    rows: list[dict[str, Any]] = []
    try:
        spec = oa.SandboxSpec(image=EXPOSED_IMAGE, network="on", ttl=3600)
        far, own = await remote.create(spec), await local.create(spec)
        if not isinstance(own, Exposes):
            raise oa.ConfigError(f"the {args.adapter} adapter's sandboxes cannot expose a port")
        for sandbox in (far, own):
            await start_keepalive_server(sandbox)
        async with http.post(f"{service.url}/sandboxes/{far.id}/services", json={"port": EXPOSED_PORT}) as response:
            service_url = (await response.json())["url"]
        urls = {
            "direct, the service's sandbox": await direct_url(far, args.adapter),
            "service URL (/s/{token}/), same server": service_url,
            "direct, an in-process sandbox": await direct_url(own, args.adapter),
            "sandbox.expose URL, same server": await own.expose(EXPOSED_PORT),
        }
        for url in urls.values():
            await answering(http, url + "/")
        ways = {way: [http_get(http, url + "/")] for way, url in urls.items()}
        for callers in (1, 16):
            for calls in ways.values():
                await round_trips(calls, callers, min(args.ops, callers * 5))  # warm up connections
            await alternate(ways, rows, callers, 1, args.ops)
        await far.close()
        await own.close()
    finally:
        await http.close()
        await remote.close()
        await local.close()
        service.stop()
    return {
        "adapter": args.adapter,
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "exposed": rows,
    }


def exposed_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"`GET /` (1 KiB, keep-alive) on adapter `{result['adapter']}`, {result['cpus']} CPUs, load average "
        "at the end " + ", ".join(f"{x:.1f}" for x in result["load_average"]),
        "",
        "| way | callers | ops | p50 ms | p99 ms | mean ms | req/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["exposed"]:
        lines.append(
            f"| {row['way']} | {row['callers']} | {row['ops']} | {row['p50_ms']} | {row['p99_ms']} "
            f"| {row['mean_ms']} | {row['ops_per_s']} |"
        )
    return "\n".join(lines) + "\n"


SLICES = 8  # how many alternating slices each way's ops are cut into (--compare-plain)


async def alternate(
    ways: dict[str, list[Callable[[], Awaitable[None]]]],
    rows: list[dict[str, Any]],
    callers: int,
    sandboxes: int,
    ops: int,
) -> None:
    """Every way's ops in SLICES slices, the ways taking turns slice by slice."""
    latencies: dict[str, list[float]] = {way: [] for way in ways}
    elapsed = dict.fromkeys(ways, 0.0)
    for _ in range(SLICES):
        for way, calls in ways.items():
            got, took = await round_trips(calls, callers, max(callers, ops // SLICES))
            latencies[way] += got
            elapsed[way] += took
    for way in ways:
        row = {"way": way, "callers": callers, "sandboxes": sandboxes, "ops": len(latencies[way])}
        rows.append({**row, **percentiles(latencies[way]), "ops_per_s": round(len(latencies[way]) / elapsed[way])})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Adapter `{result['adapter']}`, {result['cpus']} CPUs, load average at the end "
        + ", ".join(f"{x:.1f}" for x in result["load_average"]),
        "",
        "| way | callers / sandboxes | ops | p50 ms | p99 ms | mean ms | ops/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["exec"]:
        lines.append(
            f"| {row['way']} | {row['callers']} / {row['sandboxes']} | {row['ops']} | {row['p50_ms']} "
            f"| {row['p99_ms']} | {row['mean_ms']} | {row['ops_per_s']} |"
        )
    if result.get("clients"):
        lines += ["", "`GET /health` by HTTP client:", "", "| client | callers | p50 ms | p99 ms | req/s |"]
        lines.append("| --- | ---: | ---: | ---: | ---: |")
        for row in result["clients"]:
            lines.append(
                f"| {row['client']} | {row['callers']} | {row['p50_ms']} | {row['p99_ms']} | {row['ops_per_s']} |"
            )
    rates = result["create_delete"]
    lines += [
        "",
        f"Create + delete, {rates['count']} sandboxes at concurrency {rates['concurrency']}:",
        "",
        "| way | sandboxes/s | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for way in ("in-process", "remote adapter"):
        lines.append(f"| {way} | {rates[way]['per_s']} | {rates[way]['p50_ms']} | {rates[way]['p99_ms']} |")
    return "\n".join(lines) + "\n"


def levels(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(x) for x in part.split("/")) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: levels are CALLERS/SANDBOXES, comma-separated") from None
    if any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: levels are CALLERS/SANDBOXES, both at least 1")
    return pairs  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", default="local", help="the adapter behind the service and in-process")
    parser.add_argument("--adapter-options", help="JSON object of adapter options")
    parser.add_argument("--levels", type=levels, default=levels("1/1,64/64,64/8"), help="CALLERS/SANDBOXES,...")
    parser.add_argument("--ops", type=int, default=400, help="round trips per level and way (default 400)")
    parser.add_argument("--creates", type=int, default=32, help="sandboxes created and deleted per way")
    parser.add_argument("--create-concurrency", type=int, default=8)
    parser.add_argument("--max-connections", type=int, default=256, help="HTTP connections of the clients")
    parser.add_argument(
        "--compare-plain",
        action="store_true",
        help="also a second service without bash lanes (ORCHARD_SERVE_BASH_LANE=0); all ways alternate in slices",
    )
    parser.add_argument("--clients", action="store_true", help="also GET /health with httpx vs aiohttp")
    parser.add_argument(
        "--exposed",
        action="store_true",
        help="instead: a request through an exposed URL (the service's /s/{token}/, sandbox.expose) vs to the same server directly",
    )
    parser.add_argument("--json", dest="json_out", help="write the result as JSON here")
    parser.add_argument("--markdown", help="write the tables as markdown here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """One measurement, written where asked and printed (``orchard-async bench service``)."""
    for flag, path in (("--json", args.json_out), ("--markdown", args.markdown)):
        if path:
            check_output_file(path, what=flag)
    parse_adapter_options(args.adapter_options)  # bad options are one line before anything starts
    result = oa.run(measure_exposed if args.exposed else measure, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    table = exposed_markdown(result) if args.exposed else to_markdown(result)
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
