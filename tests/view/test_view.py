"""`orchard-async view` through its API (aiohttp's test client over the real app): the summary
is `inspect --json`'s, filters narrow, an episode shows its steps, diff, tests, screenshots
and tool calls, groups and two runs compare, files never come from outside the run's
folder, and bad input is one line and exit 2."""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from orchard_async.apps import cli
from orchard_async.apps.view.app import create_app, screenshot_folder
from orchard_async.apps.view.index import RunIndex
from orchard_async.records.passk import summarize_groups
from orchard_async.records.trajectory import Trajectory, TrajectoryWriter, read_trajectories
from tests.view.conftest import png


async def client_for(*paths: Path) -> TestClient:
    client = TestClient(TestServer(create_app([RunIndex.open(path) for path in paths])))
    await client.start_server()
    return client


@pytest.fixture
async def view(runs: dict[str, Path]) -> AsyncIterator[TestClient]:
    client = await client_for(runs["toy"], runs["swe"], runs["crafted"])
    yield client
    await client.close()


async def get(client: TestClient, path: str, expect: int = 200, **params: Any) -> Any:
    response = await client.get(path, params={k: str(v) for k, v in params.items()})
    assert response.status == expect, await response.text()
    return await response.json()


def inspect_json(path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> dict[str, Any]:
    capsysbinary.readouterr()
    assert cli.main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsysbinary.readouterr().out)


async def test_summary_is_inspects(view: TestClient, runs: dict[str, Path], capsysbinary) -> None:
    for run, name in enumerate(("toy", "swe", "crafted")):
        expected = inspect_json(runs[name], capsysbinary)
        data = await get(view, "/api/summary", run=run, complete=1)
        assert data["summary"] == expected
        assert data["summary"]["episodes"] == len(list(read_trajectories(runs[name]))) > 0
    toy = await get(view, "/api/summary", run=0, complete=1)
    assert toy["summary"]["retries"] > 0, "the toy run's faults should have caused retries"
    assert toy["summary"]["pass_at_k"] and not toy["pending"], "tasks sampled 4 times: pass@k is filled in"
    assert sum(toy["reward_histogram"]["counts"]) == sum(toy["time_histogram"]["counts"]) == 24
    assert toy["phases"][:2] == ["create", "setup"]
    assert math.isclose(sum(toy["summary"]["time_share"].values()), 1.0, abs_tol=1e-3)
    assert len(toy["facets"]["tasks"]) == toy["facets"]["task_count"] == 6  # 24 episodes / groups of 4


def test_pass_at_k_in_a_child_process(runs: dict[str, Path]) -> None:
    index = RunIndex.open(runs["toy"])
    expected = summarize_groups(read_trajectories(runs["toy"]))
    assert expected["group_size"] > 1
    assert index._accumulator.groups(in_child=True) == index._accumulator.groups(in_child=False) == expected


async def test_msgpack_file_summary_is_inspects(tmp_path: Path, runs: dict[str, Path], capsysbinary) -> None:
    copy = tmp_path / "toy.msgpack"
    with TrajectoryWriter(copy) as writer:
        for trajectory in read_trajectories(runs["toy"]):
            writer.write(trajectory)
    client = await client_for(copy)
    try:
        data = await get(client, "/api/summary", complete=1)
        assert data["summary"] == inspect_json(copy, capsysbinary)
        page = await get(client, "/api/episodes", limit=500)
        assert [row["episode_id"] for row in page["rows"]] == [t.episode_id for t in read_trajectories(runs["toy"])]
    finally:
        await client.close()


async def test_filters_narrow_and_every_row_matches(view: TestClient, runs: dict[str, Path]) -> None:
    everything = await get(view, "/api/episodes", run=0, limit=500)
    assert everything["total"] == len(everything["rows"]) == 24
    trajectories = list(read_trajectories(runs["toy"]))
    task = trajectories[0].task_id
    cases = {
        "task": ({"task": task}, lambda r: task in r["task_id"]),
        "group": ({"group": trajectories[0].group_id}, lambda r: r["group_id"] == trajectories[0].group_id),
        "end": ({"end": "create_failed"}, lambda r: r["end_reason"] == "create_failed"),
        "retries": ({"retries": 1}, lambda r: r["retries"] > 0),
        "status": ({"status": "failed"}, lambda r: r["status"] == "failed"),
    }
    for name, (params, holds) in cases.items():
        page = await get(view, "/api/episodes", run=0, limit=500, **params)
        expected = [row for row in everything["rows"] if holds(row)]
        assert page["rows"] == expected, name
        assert 0 < page["total"] < everything["total"], f"{name} should narrow the toy run's table"
    crafted = {
        "verifier": ({"verifier": 1}, ["mail-reply/g0/s1"]),
        "policy": ({"policy": "openai"}, ["mail-reply/g0/s0", "mail-reply/g0/s1", "mail-reply/g0/s2"]),
        "retried openai": ({"policy": "openai", "retries": 1}, ["mail-reply/g0/s2"]),
        "unknown policy": ({"policy": "nobody"}, []),
        "reward": ({"min_reward": 0.5}, ["shop-buy/g0/s0", "mail-reply/g0/s0", "fix-bug/g0/s0"]),
        "reward range": ({"min_reward": 0.2, "max_reward": 0.7}, ["mail-reply/g0/s0"]),
        "task part": ({"task": "MAIL"}, ["mail-reply/g0/s0", "mail-reply/g0/s1", "mail-reply/g0/s2"]),
        "success": ({"success": "yes", "task": "fix"}, ["fix-bug/g0/s0"]),
    }
    for name, (params, ids) in crafted.items():
        page = await get(view, "/api/episodes", run=2, **params)
        assert [row["episode_id"] for row in page["rows"]] == ids, name


async def test_sort_and_pages(view: TestClient) -> None:
    page = await get(view, "/api/episodes", run=0, sort="reward", order="desc", limit=500)
    rewards = [row["reward"] for row in page["rows"]]
    assert rewards == sorted(rewards, reverse=True)
    by_time = await get(view, "/api/episodes", run=0, sort="time", limit=500)
    times = [row["time_s"] or 0.0 for row in by_time["rows"]]
    assert times == sorted(times)
    pages = [await get(view, "/api/episodes", run=0, limit=10, offset=offset) for offset in (0, 10, 20)]
    rows = [row["row"] for p in pages for row in p["rows"]]
    assert rows == list(range(24)) and [len(p["rows"]) for p in pages] == [10, 10, 4]
    for bad in ({"sort": "nope"}, {"order": "sideways"}, {"min_reward": "lots"}, {"offset": "-1"}, {"run": 9}):
        assert "error" in await get(view, "/api/episodes", 400, **bad)


async def test_swe_episode_has_steps_patch_and_tests(view: TestClient, runs: dict[str, Path]) -> None:
    (trajectory,) = read_trajectories(runs["swe"])
    episode = await get(view, "/api/episode", run=1, row=0)
    assert episode["episode_id"] == trajectory.episode_id
    assert episode["instruction"] == trajectory.instruction
    assert [step["action"].get("command") for step in episode["steps"]] == [s.action.command for s in trajectory.steps]
    assert episode["info"]["patch"].startswith("diff --git") and episode["info"]["resolved"] is True
    assert set(episode["info"]["tests"].values()) == {"PASSED"}
    assert (await get(view, "/api/episode", 404, run=1, row=5))["error"]


async def test_gui_screenshots_and_tool_calls(view: TestClient, runs: dict[str, Path]) -> None:
    gui = await get(view, "/api/episode", run=2, row=0)
    first, step = gui["instruction_screenshot"], gui["steps"][0]
    assert first["available"] and step["screenshot"]["available"]
    assert step["acted_on"] == first, "a step's action is drawn on the screenshot it was taken on"
    assert step["gui_action"] == {"action": "click", "x": 100, "y": 50}
    folder = runs["crafted"].parent
    for shot in (first, step["screenshot"]):
        response = await view.get("/api/screenshot", params={"run": "2", "sha256": shot["sha256"]})
        assert response.status == 200 and response.content_type == "image/png"
        assert await response.read() == (folder / "screenshots" / f"{shot['sha256']}.png").read_bytes()
    extra = await view.get("/api/file", params={"run": "2", "path": gui["info"]["screenshot"]})
    assert extra.status == 200 and await extra.read() == (folder / "extra.png").read_bytes()
    claw = await get(view, "/api/episode", run=2, row=1)
    assert claw["steps"][0]["tool_calls"][0]["function"]["name"] == "mail_send"
    assert claw["steps"][0]["gui_action"] is None and claw["steps"][0]["screenshot"] is None


async def test_group_advantages_and_compare(view: TestClient, runs: dict[str, Path]) -> None:
    group = await get(view, "/api/group", run=2, group="mail-reply/g0")
    assert [s["sample"] for s in group["samples"]] == [0, 1, 2]
    scored = [s for s in group["samples"] if s["advantage"] is not None]
    assert len(scored) == group["scored"] == 2 and group["mean"] == 0.25
    assert math.isclose(sum(s["advantage"] for s in scored), 0.0, abs_tol=1e-12)
    assert group["samples"][1]["advantage"] is None  # the verifier error: not scored, no advantage
    assert (await get(view, "/api/group", 404, run=2, group="no/such"))["error"]
    two = await client_for(runs["crafted"], runs["crafted"])
    try:
        compare = await get(two, "/api/compare")
    finally:
        await two.close()
    rows = {row["task_id"]: row for row in compare["tasks"]}
    assert set(rows) == {"shop-buy", "mail-reply", "fix-bug"}
    assert rows["fix-bug"]["runs"][0] == {"episodes": 2, "mean_reward": 0.5, "success_rate": 0.5, "mean_time_s": 0.4}
    assert rows["fix-bug"]["reward_delta"] == 0.0


async def test_the_page_and_its_assets(view: TestClient) -> None:
    page = await view.get("/")
    html = await page.text()
    assert page.status == 200 and "/static/app.js" in html
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = await view.get(f"/static/{name}")
        assert asset.status == 200 and asset.content_type == kind
    assert "http" not in html, "no CDN: every asset comes from this server"


async def test_files_outside_the_run_folder_are_refused(
    view: TestClient, runs: dict[str, Path], tmp_path: Path
) -> None:
    folder = runs["crafted"].parent
    outside = tmp_path / "secret.png"
    outside.write_bytes(png(4, 4, (1, 2, 3)))
    (folder / "link.png").unlink(missing_ok=True)
    os.symlink(outside, folder / "link.png")
    digest = "f" * 64
    (folder / "screenshots" / f"{digest}.png").unlink(missing_ok=True)
    os.symlink(outside, folder / "screenshots" / f"{digest}.png")
    (folder / "notes.txt").write_text("not an image")
    refused = [
        "../secret.png",
        f"../../{tmp_path.name}/secret.png",
        str(outside),
        "/etc/passwd",
        "screenshots/../../secret.png",
        "link.png",  # a symlink out of the folder
        "notes.txt",  # inside, but not an image
        "run.jsonl",
        "",
    ]
    for path in refused:
        response = await view.get("/api/file", params={"run": "2", "path": path})
        assert response.status == 404, path
        assert await response.read() != outside.read_bytes()
    for sha in (digest, "../" * 3 + "secret", "F" * 64):
        assert (await view.get("/api/screenshot", params={"run": "2", "sha256": sha})).status == 404, sha
    for raw in (
        "/static/..%2f..%2fcli.py",
        "/static/../app.py",
        "/static/%2e%2e/index.py",
        "/api/file?run=2&path=%2e%2e/secret.png",
    ):
        response = await view.get(raw)
        assert response.status in (400, 403, 404), raw
        assert b"import" not in await response.read()
    spoofed = await view.get("/api/runs", headers={"Host": "attacker.example:8765"})
    assert spoofed.status == 403


# -- bad input: one line, exit 2 ---------------------------------------------------------------


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_not_a_trajectory_file(tmp_path: Path, view_registered, capsys) -> None:
    other = tmp_path / "data.jsonl"
    other.write_text('{"name": "a table row, not an episode"}\n')
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    for path, expected in (
        (other, "not a trajectory file"),
        (text, "unknown trajectory format"),
        (tmp_path / "no.jsonl", "no such file"),
    ):
        assert cli.main(["view", str(path), "--no-open", "--port", "0"]) == 2
        assert expected in one_error_line(capsys)


def test_port_in_use(runs: dict[str, Path], view_registered, capsys) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        assert cli.main(["view", str(runs["crafted"]), "--no-open", "--port", str(port)]) == 2
    assert f"port {port}" in one_error_line(capsys)


async def test_truncated_last_line_shows_the_good_ones(tmp_path: Path, runs: dict[str, Path], capsysbinary) -> None:
    cut = tmp_path / "cut.jsonl"
    data = runs["toy"].read_bytes()
    cut.write_bytes(data[: len(data) - 40])  # the last record loses its end (and its newline)
    client = await client_for(cut)
    try:
        summary = await get(client, "/api/summary", complete=1)
        assert summary["summary"] == inspect_json(cut, capsysbinary)
        assert summary["summary"]["episodes"] == 23
        assert any("torn last record" in warning for warning in summary["warnings"])
        assert (await get(client, "/api/episodes"))["total"] == 23
    finally:
        await client.close()


def test_set_of_marks_boxes_of_a_gui_observation_reach_the_page() -> None:
    from orchard_async.apps.view.query import screenshot_of

    digest = "ab" * 32
    observation = (
        f"feedback: scrolled down\nurl: http://127.0.0.1:7101/search\ntabs: *[0] Search\n"
        f"screenshot: sha256={digest} 1280x400 9 bytes set-of-marks\ntiming_ms: action=1.0\n"
        "marks: 2 (the number on a box is the element id; box x,y,w,h in pixels)\n"
        '[115] link "Northwind \\"Outfitters\\"" 24,10,176,18\n[97] textbox 90,80,177,21\n'
        '---\n[4] RootWebArea "Search"\n  [115] link "Northwind" 1,2,3,4\n'
    )
    shot = screenshot_of(observation)
    assert shot is not None and (shot["sha256"], shot["width"], shot["height"]) == (digest, 1280, 400)
    assert shot["marks"] == [
        {"element": "115", "role": "link", "box": [24, 10, 176, 18]},
        {"element": "97", "role": "textbox", "box": [90, 80, 177, 21]},
    ]
    assert "marks" not in screenshot_of(observation.replace("marks: 2", "nothing: 2"))


# -- screenshots kept elsewhere (view --screenshots DIR) ---------------------------------------


async def test_screenshots_from_the_folder_given(
    tmp_path: Path, runs: dict[str, Path], view_registered, capsys
) -> None:
    moved = tmp_path / "elsewhere" / "run.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(runs["crafted"].read_bytes())  # the run without its screenshots beside it
    kept = runs["crafted"].parent / "screenshots"
    shots = tmp_path / "kept-shots"
    shots.mkdir()
    for image in kept.glob("*.png"):
        if not image.is_symlink():
            (shots / image.name).write_bytes(image.read_bytes())
    outside = tmp_path / "secret.png"
    outside.write_bytes(png(4, 4, (9, 9, 9)))
    (shots / f"{'e' * 64}.png").symlink_to(outside)  # out of the folder given: never served

    async def episode_and_image(screenshots: Path | None) -> tuple[dict[str, Any], list[int]]:
        client = TestClient(TestServer(create_app([RunIndex.open(moved)], screenshots)))
        await client.start_server()
        try:
            episode = await get(client, "/api/episode", row=0)
            statuses = []
            for digest in (episode["instruction_screenshot"]["sha256"], "e" * 64):
                response = await client.get("/api/screenshot", params={"run": "0", "sha256": digest})
                statuses.append(response.status)
                if response.status == 200:
                    assert await response.read() == (shots / f"{digest}.png").read_bytes()
            return episode, statuses
        finally:
            await client.close()

    without, statuses = await episode_and_image(None)
    assert not without["instruction_screenshot"]["available"] and statuses == [404, 404]
    given, statuses = await episode_and_image(screenshot_folder(str(shots)))
    assert given["instruction_screenshot"]["available"] and given["steps"][0]["screenshot"]["available"]
    assert statuses == [200, 404]

    assert cli.main(["view", str(moved), "--screenshots", str(tmp_path / "none"), "--no-open", "--port", "0"]) == 2
    assert one_error_line(capsys) == (
        f"error: --screenshots {tmp_path / 'none'}: not a directory (the folder that holds the run's screenshots)"
    )


# -- nothing measured: "-" and null, never nan ---------------------------------------------------


def failed_before_any_command(path: Path, episodes: int) -> Path:
    path.touch()  # a run that has written nothing yet
    with TrajectoryWriter(path, run_header={"recipe": "toy", "policy": "oracle"}) as writer:
        for n in range(episodes):
            writer.write(
                Trajectory(
                    episode_id=f"t/g{n}/s0", task_id="t", group_id=f"t/g{n}", sample=0, policy="oracle",
                    adapter="local", run_id="r", status="failed", end_reason="create_failed",
                    error="CreateFailed: no sandbox",
                )
            )  # fmt: skip
    return path


@pytest.mark.parametrize("episodes", [0, 3])
async def test_a_run_with_nothing_measured_prints_no_nan(
    tmp_path: Path, episodes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = failed_before_any_command(tmp_path / "run.jsonl", episodes)
    capsys.readouterr()
    assert cli.main(["inspect", str(path)]) == 0
    table = capsys.readouterr().out
    assert "nan" not in table.lower()
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip() for line in table.splitlines() if line.count("│") == 3
    }
    assert rows["episodes"] == str(episodes) and rows["exec p50 / p99"] == "-"
    # nothing was judged (none ran, or every one failed before its scorer): no rate, not 0%
    assert rows["success rate"] == "- (none judged)" and rows["reward mean"] == "-"
    assert cli.main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exec_p50_ms"] is data["exec_p99_ms"] is None
    assert data["success_rate"] is data["mean_reward"] is None and data["judged"] == 0
    client = await client_for(path)
    try:
        assert (await get(client, "/api/summary", complete=1))["summary"] == data
    finally:
        await client.close()
