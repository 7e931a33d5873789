"""``orchard-async serve``: bad input is one line and exit 2; a real process serves, and on
SIGTERM removes every sandbox it made."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import orchard_async as oa
from orchard_async.apps import cli
from orchard_async.apps.serve.cli import add_serve_command, serve_command
from orchard_async.apps.serve.keys import KeyStore, Tenant

# What the lead's entry point does, until pyproject registers it.
REGISTER = ("orchard_async.apps.serve.cli:add_serve_command", "run the environment service")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser)
    return parser.parse_args(list(argv))


def test_without_keys_only_loopback() -> None:
    with pytest.raises(oa.ConfigError, match="loopback only; pass --keys"):
        serve_command(parse("--host", "0.0.0.0"))


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(oa.ConfigError, match=f"port {port} on 127.0.0.1 is in use") as caught:
            serve_command(parse("--port", str(port)))
    assert "\n" not in str(caught.value)


def test_bad_input_through_the_cli_exits_2(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setitem(cli.OUTSIDE_COMMANDS, "serve", REGISTER)
    (tmp_path / "keys.json").write_text('{"keys": [{"name": "a", "key": "plain-text"}]}')
    for argv, words in [
        (["serve", "--keys", str(tmp_path / "keys.json")], "never the key itself"),
        (["serve", "--keys", str(tmp_path / "none.json")], "cannot read"),
        (["serve", "--adapter", "nope"], "unknown adapter"),
        (["serve", "--adapter-options", "{bad"], "not valid JSON"),
        (["serve", "--port", "70000"], "between 0 and 65535"),
        (["serve", "--max-sandboxes", "0"], "must be positive"),
    ]:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err


def test_new_key(capsys) -> None:
    assert serve_command(parse("--new-key", "team-z")) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    entry = json.loads(err.split(": ", 1)[1])
    assert entry["name"] == "team-z" and key not in err
    assert KeyStore([Tenant(**entry)]).authenticate(key).name == "team-z"


def test_a_served_process_answers_and_cleans_up_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHARD_LOCAL_ROOT": str(tmp_path / "sandboxes")}
    program = (
        "import sys; from orchard_async.apps import cli; "
        f"cli.OUTSIDE_COMMANDS['serve'] = {REGISTER!r}; sys.exit(cli.main(sys.argv[1:]))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", program, "serve", "--port", "0"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        first = process.stderr.readline()
        assert "no API keys: loopback only" in first, first
        url = re.search(r"http://\S+", first)[0]
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/health").json()["status"] == "healthy"
            made = http.post("/sandboxes", json={"image": "x", "block_network": True}).json()
            assert http.get(f"/sandboxes/{made['sandbox_id']}/wait", params={"timeout": 60}).json()["ready"]
            assert len(list((tmp_path / "sandboxes").iterdir())) == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        log = process.stderr.read()
        assert '"path": "/sandboxes"' in log  # one structured line per request
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_kill_9_then_restart_leaves_no_sandbox(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHARD_LOCAL_ROOT": str(tmp_path / "sandboxes")}
    program = (
        "import sys; from orchard_async.apps import cli; "
        f"cli.OUTSIDE_COMMANDS['serve'] = {REGISTER!r}; sys.exit(cli.main(sys.argv[1:]))"
    )

    def start() -> tuple[subprocess.Popen, str]:
        process = subprocess.Popen(
            [sys.executable, "-c", program, "serve", "--port", "0"], env=env, stderr=subprocess.PIPE, text=True
        )
        return process, re.search(r"http://\S+", process.stderr.readline())[0]

    first, url = start()
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(3):
                made = http.post("/sandboxes", json={"image": "x", "block_network": True}).json()
                http.get(f"/sandboxes/{made['sandbox_id']}/wait", params={"timeout": 60})
    finally:
        first.kill()  # SIGKILL: no cleanup of its own
        first.wait()
    second, url = start()
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/sandboxes").json()["sandboxes"] == []  # nothing adopted: its state died with it
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert list((tmp_path / "sandboxes").iterdir()) == []
