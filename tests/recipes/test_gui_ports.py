"""GUI tasks whose sandbox has the network on share it, on the local adapter, with the host
and every other such sandbox: the bundled sites of each sandbox must listen on ports of its
own, or the second one at once fails with "Address already in use". Run here through the
`run` command at --concurrency 4 against a stand-in live site and a stand-in judge on this
machine's loopback (there is no internet), with a bundled-site task next to them so that a
site's own port is also what the start page and the grader use."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchard_async.apps import cli
from orchard_async.recipes import gui
from orchard_async.recipes.gui.task import _Live
from orchard_async.records.trajectory import read_trajectories
from tests.conftest import backend_missing
from tests.recipes.swe_support import chat_reply
from tests.recipes.test_gui_browser import _chromium

PAGE = b"<!doctype html><title>Stand-in</title><h1>Harbour tides</h1><p>High tide today is at 14:05.</p>"
ATTEMPTS = 30


class StandIn(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_in_site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def task_file(path: Path, site_url: str) -> Path:
    (tote,) = [
        json.loads(line) for line in gui.task.builtin_path().read_text().splitlines() if '"shop-add-tote"' in line
    ]
    live = {
        "id": "tides-live",
        "site": "tides.example",
        "start_url": site_url,
        "intent": "When is high tide today?",
        "eval": [{"type": "llm_judge"}],
        "solution": [{"action": "answer", "text": "14:05"}],
        "network": "on",
    }
    path.write_text(json.dumps(live) + "\n" + json.dumps(tote | {"id": "tote-network-on", "network": "on"}) + "\n")
    return path


@pytest.mark.soak  # 30 browser episodes: about 90 s on 2 cores; `pytest -m soak` (CI runs it)
def test_live_tasks_at_concurrency_4_on_local_never_share_a_port(tmp_path, chat_server, stand_in_site, monkeypatch):
    if _chromium() is None:
        backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")
    judge = chat_server(lambda request, index: chat_reply("The page shows the high tide time.\n\nSUCCESS"))
    monkeypatch.setenv("ORCHARD_JUDGE_MODEL", "judge-model")
    monkeypatch.setenv("ORCHARD_JUDGE_BASE_URL", judge.base_url)
    tasks, out = task_file(tmp_path / "tasks.jsonl", stand_in_site), tmp_path / "run.jsonl"
    argv = ["run", "gui", "--tasks", str(tasks), "--adapter", "local", "--adapter-options"]
    argv += [json.dumps({"root": str(tmp_path / "root")}), "--concurrency", "4", "--episodes", str(ATTEMPTS)]
    argv += ["--max-retries", "0", "--out", str(out)]
    cli.main(argv)  # its exit code is not the subject: every attempt is read from the file below
    trajectories = list(read_trajectories(out))
    assert len(trajectories) == ATTEMPTS
    failed = [f"{t.task_id}: {t.end_reason}: {t.error[-400:]}" for t in trajectories if t.status != "finished"]
    assert not failed, f"{len(failed)} of {ATTEMPTS} attempts failed:\n" + "\n".join(failed)
    assert not [t for t in trajectories if "Address already in use" in t.error]
    assert Counter((t.task_id, t.reward) for t in trajectories) == {
        ("tides-live", 1.0): ATTEMPTS // 2,
        ("tote-network-on", 1.0): ATTEMPTS // 2,
    }
    shop_ports = {
        int(port)
        for t in trajectories
        if t.task_id == "tote-network-on"
        for port in re.findall(r"^url: http://127\.0\.0\.1:(\d+)/", t.instruction, re.MULTILINE)
    }
    assert len(shop_ports) > 1  # the shops of sandboxes that ran at once, each on a port of its own
    assert len(judge.requests) == ATTEMPTS // 2


def test_urls_move_between_the_ports_tasks_are_written_for_and_the_sandbox_s():
    live = _Live(sandbox=None, key=b"", ports={"shop": 40001, "booking": 7102, "forum": 40003})
    assert live.url_in_sandbox("http://127.0.0.1:7101/search?q=tote") == "http://127.0.0.1:40001/search?q=tote"
    assert live.url_in_sandbox("http://localhost:7103/wiki") == "http://localhost:40003/wiki"
    assert live.url_in_sandbox("http://127.0.0.1:7102/book") == "http://127.0.0.1:7102/book"
    assert live.url_as_written("http://127.0.0.1:40001/cart") == "http://127.0.0.1:7101/cart"
    for elsewhere in ("https://www.example.com:7101/", "http://127.0.0.1:9999/", "about:blank", "http://[::1:bad/"):
        assert live.url_in_sandbox(elsewhere) == elsewhere == live.url_as_written(elsewhere)
