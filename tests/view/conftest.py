"""Runs to view: real ones (toy on sim with infrastructure faults, SWE's oracle on local) made
by the real `run` command, and a hand-written one holding what those lack (GUI screenshots,
tool calls, verifier errors)."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import pytest

from orchard_async.apps import cli
from orchard_async.records.trajectory import Action, Retry, Step, Trajectory, TrajectoryWriter

VIEW_COMMAND = ("orchard_async.apps.view.cli:add_view_command", "look at a run in the browser")


@pytest.fixture
def view_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """`orchard-async view` as the installed package will have it (its entry point), also
    in a checkout whose metadata predates the command."""
    monkeypatch.setitem(cli.OUTSIDE_COMMANDS, "view", VIEW_COMMAND)


def run_command(*argv: str) -> None:
    code = cli.main(list(argv))
    assert code == 0, f"orchard-async {' '.join(argv)} exited {code}"


def make_runs(folder: Path) -> dict[str, Path]:
    toy = folder / "toy.jsonl"
    faults = json.dumps({"create_failure_rate": 0.3, "seed": 7})
    run_command(
        "run", "toy", "--adapter", "sim", "--adapter-options", faults,
        "--episodes", "24", "--group-size", "4", "--max-retries", "1", "--out", str(toy),
    )  # fmt: skip
    swe = folder / "swe.jsonl"
    run_command(
        "run", "swe", "--adapter", "local", "--tasks", "builtin:minicalc__6", "--episodes", "1", "--out", str(swe)
    )
    crafted = folder / "crafted" / "run.jsonl"
    write_crafted_run(crafted)
    return {"toy": toy, "swe": swe, "crafted": crafted}


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid PNG of one colour."""
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def gui_observation(digest: str, feedback: str) -> str:
    """What the GUI recipe's browser driver answers a step with (recipes/gui/inside/browserd.py)."""
    return (
        f"feedback: {feedback}\nurl: http://127.0.0.1:7101/\ntabs: *[0] Shop\n"
        f"screenshot: sha256={digest} 320x200 1234 bytes\ntiming_ms: screenshot=12.0 tree=3.0\n---\n"
        '[12] button "Add to cart"\n'
    )


def write_crafted_run(path: Path) -> dict[str, str]:
    """Six episodes: two GUI steps with screenshots kept by hash in the run's folder, a
    function-calling episode, a verifier error, a retried one, and a SWE-shaped one."""
    shots = path.parent / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    first, second = png(320, 200, (40, 120, 200)), png(320, 200, (200, 80, 40))
    digests = []
    for image in (first, second):
        digest = hashlib.sha256(image).hexdigest()
        (shots / f"{digest}.png").write_bytes(image)
        digests.append(digest)
    (path.parent / "extra.png").write_bytes(png(8, 8, (0, 0, 0)))
    common = {"adapter": "local", "run_id": "crafted", "timings": {"create": 0.1, "agent": 0.2, "total": 0.4}}
    click = json.dumps({"action": "click", "x": 100, "y": 50}, separators=(",", ":"))
    episodes = [
        Trajectory(
            episode_id="shop-buy/g0/s0", task_id="shop-buy", group_id="shop-buy/g0", sample=0, policy="oracle",
            status="finished", end_reason="submitted", reward=1.0, success=True,
            instruction="Buy the rain shell.\n\n" + gui_observation(digests[0], "opened"),
            steps=[
                Step(index=0, action=Action(command=f".gui/act '{click}'", raw=click),
                     observation=gui_observation(digests[1], "clicked"), exit_code=0, reason="ok", exec_s=0.05),
                Step(index=1, action=Action(kind="submit")),
            ],
            info={"checks": [{"type": "purchase", "score": 1.0}], "screenshot": "extra.png"}, **common,
        ),
        Trajectory(
            episode_id="mail-reply/g0/s0", task_id="mail-reply", group_id="mail-reply/g0", sample=0, policy="openai",
            status="finished", end_reason="submitted", reward=0.5, success=False,
            instruction="Reply to Ann.",
            steps=[Step(index=0, action=Action(
                command="mail send --to ann",
                raw=json.dumps({"role": "assistant", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "mail_send", "arguments": '{"to": "ann"}'}}]}),
            ), observation='{"sent": true}\n', exit_code=0, reason="ok", exec_s=0.02)],
            info={"score": 0.5, "completion": 0.5, "safety": 1.0, "robustness": 1.0, "audit": [
                {"seq": 1, "t": 0.4, "tool": "mail_send", "args": {"to": "ann"}, "via": "function", "status": 200,
                 "ok": True, "changes": [  # as the Claw services audit them (recipes/claw/sandbox/claw_tools.py)
                     {"op": "insert", "at": "mail.sent", "key": "s1", "before": None, "after": {"id": "s1"}},
                     {"op": "update", "at": "mail.inbox", "key": "m1.read", "before": False, "after": True}]},
                {"seq": 2, "t": 0.9, "tool": "calendar_add", "args": {"day": "mon"}, "via": "cli", "status": 503,
                 "ok": False, "error": "injected fault", "fault": 503}]}, **common,
        ),
        Trajectory(
            episode_id="mail-reply/g0/s1", task_id="mail-reply", group_id="mail-reply/g0", sample=1, policy="openai",
            status="failed", end_reason="verifier_error", error="VerifierError: the grader did not answer", **common,
        ),
        Trajectory(
            episode_id="mail-reply/g0/s2", task_id="mail-reply", group_id="mail-reply/g0", sample=2, policy="openai",
            status="finished", end_reason="max_steps", reward=0.0,
            retries=[Retry(attempt=0, reason="sandbox_lost", error="SandboxLost: gone", duration=0.3)], **common,
        ),
        Trajectory(
            episode_id="fix-bug/g0/s0", task_id="fix-bug", group_id="fix-bug/g0", sample=0, policy="oracle",
            status="finished", end_reason="submitted", reward=1.0, success=True, instruction="Fix it.",
            steps=[Step(index=0, action=Action(command="cat a.py"), observation="x" * 9000 + "END",
                        exit_code=0, reason="ok", stdout_cut=500)],
            info={"patch": "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
                  "tests": {"tests/test_a.py::test_x": "PASSED", "tests/test_a.py::test_y": "FAILED"}},
            **common,
        ),
        Trajectory(
            episode_id="fix-bug/g0/s1", task_id="fix-bug", group_id="fix-bug/g0", sample=1, policy="oracle",
            status="finished", end_reason="submitted", reward=0.0, instruction="Fix it.", **common,
        ),
    ]  # fmt: skip
    with TrajectoryWriter(path, run_header={"recipe": "crafted", "policy": "mixed"}) as writer:
        for trajectory in episodes:
            writer.write(trajectory)
    return {"first": digests[0], "second": digests[1]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_runs(tmp_path_factory.mktemp("view-runs"))
