"""`orchard-async view` started as a command (its own process, a free port) and driven in
headless Chromium with Playwright: the summary's numbers are `inspect --json`'s, a filter
narrows the table, an episode shows its steps, a SWE diff renders, a GUI screenshot loads,
and the page never trips its Content-Security-Policy."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard_async.apps import cli
from orchard_async.records.trajectory import read_trajectories
from tests.conftest import backend_missing
from tests.view.conftest import VIEW_COMMAND

CHROMIUM = "/usr/bin/chromium"
# The command as the installed package runs it (the entry point may predate this checkout's metadata).
LAUNCHER = (
    "import sys; from orchard_async.apps import cli; "
    f"cli.OUTSIDE_COMMANDS.setdefault('view', {VIEW_COMMAND!r}); sys.exit(cli.main())"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium under Playwright's sync API, which keeps an event loop running in this thread:
    a test takes it after the fixtures that run commands (anyio.run) are made."""
    if not shutil.which(CHROMIUM):
        backend_missing(f"{CHROMIUM} is not installed (Debian's chromium package)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        backend_missing("playwright is not installed: pip install -e '.[browser]' (no browser download needed)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


def read_line_with(lines: queue.Queue[str], marker: str, seconds: float) -> str:
    """The first line containing ``marker``, waiting at most ``seconds``."""
    deadline = time.monotonic() + seconds
    seen = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        seen.append(line)
        if marker in line:
            return line
    raise AssertionError(f"no {marker!r} from the view command within {seconds} s: {''.join(seen)}")


@pytest.fixture(scope="module")
def served(runs: dict[str, Path]) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "view", str(runs["swe"]), str(runs["crafted"]), "--port", "0", "--no-open"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BROWSER": "true"},
    )
    # A thread reads its stderr: select() on a buffered stream misses lines already in the buffer.
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True)
    reader.start()
    try:
        line = read_line_with(lines, "http://127.0.0.1:", 60)
        yield line.split()[2]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, "SIGTERM stops the server cleanly"
        reader.join(timeout=10)
        process.stderr.close()


def inspect_json(path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> dict[str, Any]:
    capsysbinary.readouterr()
    assert cli.main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsysbinary.readouterr().out)


# The browser before the server: without Chromium or Playwright the test skips before a server starts
# (one stopped at once could miss its SIGTERM handler).
def test_the_page_in_chromium(runs: dict[str, Path], browser: Any, served: str, capsysbinary) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))

    # The summary: every number on the page is inspect --json's.
    page.goto(served + "#/run/1")
    page.wait_for_selector("#summary[data-pending=false]")  # pass@k filled in (computed after start)
    expected = inspect_json(runs["crafted"], capsysbinary)
    shown = {
        element.get_attribute("data-field"): json.loads(element.get_attribute("data-value"))
        for element in page.query_selector_all("[data-field]")
    }
    assert {"episodes", "finished", "failed", "success_rate", "mean_reward", "retries", "verifier_errors"} <= set(shown)
    assert shown == {key: expected[key] for key in shown}
    assert page.inner_text("[data-field=episodes]") == str(expected["episodes"])
    assert page.locator("[data-testid=time-share] span").count() == len(expected["time_share"])

    # A filter narrows the table.
    page.wait_for_selector("[data-testid=total][data-total]")
    assert page.get_attribute("[data-testid=total]", "data-total") == str(expected["episodes"])
    page.fill("form.filters input[name=task]", "mail")
    page.click("form.filters button[type=submit]")
    page.wait_for_selector("[data-testid=total][data-total='3']")
    rows = page.locator("table[data-testid=episodes] tbody tr")
    assert rows.count() == 3 and all("mail-reply" in text for text in rows.all_inner_texts())

    # An episode shows its steps; the GUI one its screenshots, loaded, with the click drawn.
    page.goto(served + "#/run/1")
    page.click("table[data-testid=episodes] a >> text=shop-buy/g0/s0")
    page.wait_for_selector("[data-testid=episode-id]")
    assert page.inner_text("[data-testid=episode-id]") == "shop-buy/g0/s0"
    assert page.locator("[data-testid=step]").count() == 2
    screenshot = page.locator("[data-testid=step] img[data-testid=screenshot]").first
    screenshot.wait_for()
    page.wait_for_function("() => [...document.querySelectorAll('img[data-testid=screenshot]')].every(i => i.complete)")
    widths = page.eval_on_selector_all("img[data-testid=screenshot]", "images => images.map(i => i.naturalWidth)")
    assert widths and all(width == 320 for width in widths)
    assert page.locator(".shot svg circle.mark").count() == 1

    # A SWE episode: its steps and its patch as a coloured diff, its tests' statuses.
    (swe,) = read_trajectories(runs["swe"])
    page.goto(served + "#/run/0/episode/0")
    page.wait_for_selector("[data-testid=diff]")
    assert page.locator("[data-testid=step]").count() == len(swe.steps)
    assert page.locator("[data-testid=diff] span.add").count() > 0
    assert page.locator("[data-testid=diff] span.del").count() > 0
    assert page.locator("[data-testid=tests] td.status-PASSED").count() == len(swe.info["tests"])

    # A Claw episode: its tool calls and the services' audit, a failed call marked.
    page.goto(served + "#/run/1")
    page.click("table[data-testid=episodes] a >> text=mail-reply/g0/s0")
    page.wait_for_selector("table[data-testid=audit]")
    assert page.locator("table[data-testid=audit] tbody tr").count() == 2
    assert page.locator("table[data-testid=audit] td.status-FAILED").all_inner_texts() == ["503 (injected)"]
    changes = page.locator("table[data-testid=audit] tbody tr td:last-child").all_inner_texts()
    assert changes == ["insert mail.sent s1; update mail.inbox m1.read: false → true", "injected fault"]
    assert "[object Object]" not in page.inner_text("main")

    # The group view and the per-task comparison of the two runs.
    page.goto(served + "#/run/1/group/mail-reply%2Fg0")
    page.wait_for_selector("[data-testid=sample]")
    assert page.locator("[data-testid=sample]").count() == 3
    page.goto(served + "#/compare")
    page.wait_for_selector("table[data-testid=compare] tbody tr")
    assert page.locator("table[data-testid=compare] tbody tr").count() == 4  # 1 SWE task + 3 crafted ones
    page.close()
    assert problems == [], problems
