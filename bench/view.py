"""How fast ``view`` opens a large run, and how much memory its server keeps.

    python -m orchard_async.bench.view out/big.jsonl --episodes 100000 [--screenshots DIR]

With ``--episodes`` it first makes the run, or completes it (the toy recipe's oracle on sim
in groups of 4, as ``orchard-async run toy --adapter sim --group-size 4``), then starts the view command in its own
process and reports, as one JSON object:

* ``index_s``: the server's one scan of the file (its own report), ``ready_s``: from
  starting the process to the server listening, and the CPU seconds it had used by then;
* ``first_load_s``: the page's first load: in headless Chromium (Playwright, Debian's
  chromium) from navigation to the summary and the first page of the table drawn; without
  a browser, the page's own requests (HTML, script, style, runs, summary, first table page)
  one after another over HTTP;
* ``queries_ms``: a few table queries over the whole run (filter, sort, a far page);
* ``rss_mb`` and ``peak_rss_mb``: the server's resident memory after those, and its peak.

``--screenshots DIR`` also saves the summary and an episode page as PNG (for the README).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from orchard_async.kit import procfs

CHROMIUM = "/usr/bin/chromium"


def make_run(path: Path, episodes: int) -> None:
    """The toy recipe's oracle on sim, through the library's ``collect`` (what ``orchard-async
    run toy --adapter sim`` does, less the progress bar's per-episode bookkeeping)."""
    from orchard_async import collect, get_adapter, load_recipe, run

    options: dict[str, Any] = {}  # no faults: what is measured here is size
    recipe = load_recipe("toy")
    resume = path.exists()

    async def go() -> None:
        adapter = get_adapter("sim", **options)
        try:
            header = {"recipe": "toy", "task_source": "builtin", "adapter_options": options}
            await collect(
                recipe.load_tasks("builtin"), recipe.make_policy("oracle"), adapter, path,
                n=episodes, group_size=4, concurrency=500, resume=resume, run_header=header,
            )  # fmt: skip
        finally:
            await adapter.close()

    run(go)


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) of a live process, in MB."""
    resident, peak = procfs.status_kib("VmRSS", pid), procfs.status_kib("VmHWM", pid)
    if resident is None or peak is None:
        raise RuntimeError(f"no memory figures for process {pid}: it has ended")
    return resident / 1024, peak / 1024


def cpu_s(pid: int) -> float:
    """User and system CPU seconds a process has used (load on the machine does not inflate
    them as it does wall-clock times) of a live process."""
    times = procfs.cpu_seconds(pid)
    if times is None:
        raise RuntimeError(f"no CPU time for process {pid}: it has ended")
    return times[0]


def start_view(path: Path) -> tuple[subprocess.Popen[str], str, float, float]:
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "orchard_async.apps.view", str(path), "--port", "0", "--no-open"],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()
    index_s = float("nan")
    while True:
        try:
            line = lines.get(timeout=600)
        except queue.Empty:
            process.kill()
            raise SystemExit("the view command did not start within 600 s") from None
        sys.stderr.write(line)
        if " indexed in " in line:
            index_s = float(line.rsplit(" indexed in ", 1)[1].split()[0])
        if "http://127.0.0.1:" in line:
            return process, line.split()[2], index_s, time.perf_counter() - started
        if process.poll() is not None:
            raise SystemExit(f"the view command exited with {process.returncode}")


def load_with_http(url: str) -> float:
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=120) as client:
        for path in (
            "/",
            "/static/app.js",
            "/static/style.css",
            "/api/runs",
            "/api/summary?run=0",
            "/api/episodes?run=0",
        ):
            client.get(path).raise_for_status()
    return time.perf_counter() - started


def load_in_browser(url: str, screenshots: Path | None) -> float | None:
    if not shutil.which(CHROMIUM):
        return None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("table[data-testid=episodes] tbody tr")
        page.wait_for_selector("[data-field=episodes]")
        elapsed = time.perf_counter() - started
        if screenshots is not None:
            screenshots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshots / "view-summary.png"))
            page.click("table[data-testid=episodes] tbody tr a")
            page.wait_for_selector("[data-testid=step]")
            page.screenshot(path=str(screenshots / "view-episode.png"))
        browser.close()
        return elapsed


def time_queries(url: str) -> dict[str, float]:
    queries = {
        "task filter": "/api/episodes?run=0&task=sum",
        "sort by reward": "/api/episodes?run=0&sort=reward&order=desc",
        "failed, by time": "/api/episodes?run=0&status=failed&sort=time&order=desc",
        "page 1000": "/api/episodes?run=0&offset=50000",
        "episode": "/api/episode?run=0&row=99999",
        "compare": "/api/compare",
    }
    timings = {}
    with httpx.Client(base_url=url, timeout=120) as client:
        for name, path in queries.items():
            started = time.perf_counter()
            response = client.get(path)
            timings[name] = round((time.perf_counter() - started) * 1000, 1)
            if response.status_code >= 500:
                response.raise_for_status()
    return timings


def measure(path: Path, screenshots: Path | None) -> dict[str, Any]:
    process, url, index_s, ready_s = start_view(path)
    ready_cpu_s = cpu_s(process.pid)
    try:
        browser_s = load_in_browser(url, screenshots)
        http_s = load_with_http(url)
        queries = time_queries(url)
        episodes = httpx.get(url + "api/runs", timeout=60).json()[0]["episodes"]
        rss, peak = memory_mb(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return {
        "file": str(path),
        "file_mb": round(os.path.getsize(path) / 1e6, 1),
        "episodes": episodes,
        "index_s": index_s,
        "ready_s": round(ready_s, 2),
        "server_cpu_s_at_ready": round(ready_cpu_s, 2),
        "first_load_s": round(browser_s if browser_s is not None else http_s, 3),
        "first_load_in": "chromium" if browser_s is not None else "http requests",
        "first_load_http_s": round(http_s, 3),
        "queries_ms": queries,
        "rss_mb": round(rss, 1),
        "peak_rss_mb": round(peak, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="trajectory file (made when missing and --episodes is given)")
    parser.add_argument("--episodes", type=int, help="make (or complete) FILE: a toy run on sim of this many episodes")
    parser.add_argument("--screenshots", type=Path, help="save the summary and an episode page here as PNG")
    args = parser.parse_args()
    if args.episodes:
        make_run(args.file, args.episodes)  # resumes a file that has fewer
    elif not args.file.exists():
        raise SystemExit(f"{args.file} does not exist; pass --episodes N to make it")
    print(json.dumps(measure(args.file, args.screenshots), indent=2))


if __name__ == "__main__":
    main()
