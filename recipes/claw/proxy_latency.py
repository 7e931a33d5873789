"""How much latency the recording proxy adds to one model call, against a scripted upstream
that answers at once (so the numbers are the proxy's and the relay's own cost):

* controller: httpx -> upstream, against httpx -> proxy -> upstream (keep-alive);
* sandbox (local adapter, no network: the upstream is unreachable from it directly): a
  urllib client in the sandbox (a new connection per call, as the bundled harness does) ->
  in-sandbox relay -> stream -> upstream (the relay's own cost), against -> relay -> stream
  -> proxy -> upstream (what harness mode does).

    python -m orchard_async.recipes.claw.proxy_latency [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time

import anyio
import anyio.from_thread
import anyio.lowlevel
import httpx

import orchard_async as oa
from orchard_async.models.proxy import ModelProxy, Upstream, serve_into

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello " * 200}]}  # ~1.2 kB, a short prompt

SANDBOX_CLIENT = r"""
import json, os, sys, time, urllib.request
url, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = sys.stdin.buffer.read()
out = []
for _ in range(n):
    req = urllib.request.Request(url + "/chat/completions", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + key)
    t = time.perf_counter()
    with opener.open(req, timeout=30) as reply:
        reply.read()
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"median_ms": round(statistics.median(ms), 3), "p90_ms": round(ms[int(len(ms) * 0.9)], 3)}


async def controller_side(url: str, headers: dict[str, str], calls: int) -> list[float]:
    async with httpx.AsyncClient(headers=headers) as client:
        await client.post(url + "/chat/completions", json=BODY)  # warm the connection
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            (await client.post(url + "/chat/completions", json=BODY)).raise_for_status()
            samples.append(time.perf_counter() - start)
    return samples


REPLY = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 200, "completion_tokens": 1, "total_tokens": 201},
}


class InstantUpstream:
    """An OpenAI-compatible server answering at once, in its own thread and event loop."""

    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._stop: anyio.Event | None = None
        self._token: object = None
        self._thread = threading.Thread(target=lambda: anyio.run(self._serve), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response(REPLY)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._stop, self._token = anyio.Event(), anyio.lowlevel.current_token()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def start(self) -> InstantUpstream:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        anyio.from_thread.run_sync(self._stop.set, token=self._token)
        self._thread.join(10)


async def measure(calls: int) -> dict[str, dict[str, float]]:
    upstream = InstantUpstream().start()
    results: dict[str, dict[str, float]] = {}
    try:
        async with ModelProxy(Upstream(upstream.base_url)) as proxy:
            session = proxy.open_session("bench")
            auth = {"Authorization": f"Bearer {session.key}"}
            results["controller: direct"] = summary(await controller_side(upstream.base_url, {}, calls))
            results["controller: via proxy"] = summary(await controller_side(proxy.base_url, auth, calls))
            with tempfile.TemporaryDirectory() as root:
                adapter = oa.get_adapter("local", root=root)
                try:
                    async with await adapter.create(oa.SandboxSpec()) as box:
                        await box.write_file("client.py", SANDBOX_CLIENT)

                        async def in_sandbox(url: str) -> list[float]:
                            command = f"python3 client.py {url} {session.key} {calls}"
                            result = await box.exec(command, stdin=json.dumps(BODY).encode(), timeout=300)
                            if not result.ok:
                                raise RuntimeError(result.text + result.error_text)
                            return json.loads(result.text)

                        async with serve_into(box, upstream.port) as port:
                            results["sandbox: via relay only"] = summary(
                                await in_sandbox(f"http://127.0.0.1:{port}/v1")
                            )
                        async with serve_into(box, proxy.port) as port:
                            results["sandbox: via relay+proxy"] = summary(
                                await in_sandbox(f"http://127.0.0.1:{port}/v1")
                            )
                finally:
                    await adapter.close()
            recorded = proxy.close_session(session)
            results["recorded calls"] = {"count": len(recorded)}
    finally:
        upstream.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(anyio.run(measure, args.calls), indent=2))


if __name__ == "__main__":
    main()
