"""GUI trajectories out as training data with screenshots as image parts (no browser: the
trajectories are written as a run writes them, the screenshots kept by hash beside them)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import msgspec
import pytest

import orchard_async as oa
from orchard_async.apps.cli import main as cli_main
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.export import GuiChats, export

RUN = "gui-run-1"


def _shots(folder: Path, count: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    digests = []
    for index in range(count):
        data = b"\x89PNG\r\n\x1a\n" + bytes([index]) * 16
        digest = hashlib.sha256(data).hexdigest()
        (folder / f"{digest}.png").write_bytes(data)
        digests.append(digest)
    return digests


def _page(digest: str, feedback: str) -> str:
    return f"feedback: {feedback}\nurl: http://127.0.0.1:7101/\nscreenshot: sha256={digest} 1280x720 24 bytes\n---\n[4] RootWebArea\n"


def _step(index: int, action: dict, reply: str, observation: str) -> oa.Step:
    return oa.Step(index=index, action=actions.to_action(action, raw=reply), observation=observation)


def _invalid(index: int) -> oa.Step:
    return oa.Step(
        index=index,
        action=oa.Action(kind="invalid", raw="I will look around.", error="no action found"),
        observation="error: no action found",
    )


def _trajectory(
    sample: int, end_reason: str, reward: float, steps: list[oa.Step], first: str, **extra
) -> oa.Trajectory:
    return oa.Trajectory(
        episode_id=f"shop-add-tote/g0/s{sample}",
        task_id="shop-add-tote",
        group_id="shop-add-tote/g0",
        sample=sample,
        policy="openai:m",
        adapter="local",
        run_id=RUN,
        status=extra.pop("status", "finished"),
        end_reason=end_reason,
        reward=reward,
        success=reward == 1.0,
        instruction=f"Add one tote to the cart.\n\nThe browser shows:\n{_page(first, 'opened http://127.0.0.1:7101/')}",
        steps=steps,
        **extra,
    )


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    shots = _shots(tmp_path / "shots", 6)
    solved = [
        _invalid(0),
        _step(1, {"action": "click", "element": "29"}, "Bags first.\n```json\n{...}\n```", _page(shots[1], "clicked")),
        _step(2, {"action": "click", "element": "40"}, "The tote.", _page(shots[2], "clicked [40]")),
        _step(3, {"action": "answer", "text": "Added."}, "Done.", _page(shots[3], 'answer recorded: "Added."')),
        oa.Step(index=4, action=oa.Action(kind="submit", command="submit", raw='{"action": "submit"}')),
    ]
    babbled = [_step(0, {"action": "scroll"}, "Scrolling.", _page(shots[4], "scrolled down"))]
    babbled += [_invalid(i) for i in (1, 2, 3)]
    trajectories = [
        _trajectory(0, "submitted", 1.0, solved, shots[0]),
        _trajectory(1, "parse_failures", 0.0, babbled, shots[0]),
        _trajectory(2, "sandbox_lost", 0.0, [], shots[0], status="failed", error="the browser crashed"),
        _trajectory(
            3, "max_steps", 0.0, [_step(0, {"action": "go_back"}, "Back.", _page(shots[5], "went back"))], shots[0]
        ),
    ]
    path = tmp_path / "gui.jsonl"
    lines = [json.dumps({"orchard_run": {"recipe": "gui", "run_id": RUN}})]
    lines += [msgspec.json.encode(t).decode() for t in trajectories]
    path.write_text("\n".join(lines) + "\n")
    return path, tmp_path / "shots", shots


def _images(message: dict) -> list[str]:
    assert isinstance(message["content"], str)  # the text; the images apart, in every message
    return message["image_urls"]


def test_sft_records_are_chats_with_the_last_screenshots_as_image_parts(run, tmp_path):
    path, shots_dir, shots = run
    out = tmp_path / "sft.jsonl"
    assert cli_main(["export-gui", "sft", str(path), "--screenshots", str(shots_dir), "--out", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    messages = record["messages"]
    assert record["episode_id"] == "shop-add-tote/g0/s0" and record["resolved"] and "patch" not in record
    assert messages[0]["role"] == "system" and "element" in messages[0]["content"]
    assert [m["content"] for m in messages if m["role"] == "assistant"][-1] == "Done."  # not the policy's submit
    assert messages[-1]["role"] == "assistant" and "Format error" in json.dumps(messages[3])
    # At its last reply the model had seen 3 screenshots (the page after it, none): all kept.
    assert record["images"] == shots[0:3]
    urls = [url for message in messages for url in _images(message)]
    assert [base64.b64decode(url.split(",", 1)[1]) for url in urls] == [
        (shots_dir / f"{digest}.png").read_bytes() for digest in shots[0:3]
    ]
    assert all(url.startswith("data:image/png;base64,") for url in urls)
    narrow = export("sft", path, tmp_path / "two.jsonl", GuiChats(shots_dir, screenshots=2))
    (record,) = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert narrow.records == 1 and record["images"] == shots[1:3]
    assert "screenshot omitted" in record["messages"][1]["content"] and not _images(record["messages"][1])


def test_rl_groups_keep_parse_failures_and_drop_infrastructure_ends(run, tmp_path):
    path, shots_dir, shots = run
    chats = GuiChats(shots_dir, screenshots=1, image_urls="file")
    summary = export("rl", path, tmp_path / "rl.jsonl", chats)
    records = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    assert [r["episode_id"][-2:] for r in records] == ["s0", "s1", "s3"]  # s2 ended sandbox_lost
    assert summary.skipped_reasons == {"sandbox_lost": 1} and summary.groups_partial == 1
    assert [r["end_reason"] for r in records] == ["submitted", "parse_failures", "max_steps"]
    assert [round(r["advantage"], 6) for r in records] == [round(2 / 3, 6), round(-1 / 3, 6), round(-1 / 3, 6)]
    for record in records:
        assert [m["train"] for m in record["messages"]] == [m["role"] == "assistant" for m in record["messages"]]
        (url,) = [url for message in record["messages"] for url in _images(message)]  # the latest one only
        assert url == (shots_dir / f"{record['images'][0]}.png").resolve().as_uri()
    assert records[1]["images"] == [shots[4]] and records[1]["messages"][-1]["content"].startswith("Format error")
    sft = export("sft", path, tmp_path / "sft.jsonl", chats, min_reward=0.0)
    assert sft.records == 2 and sft.skipped_reasons == {"sandbox_lost": 1, "parse_failures": 1}


def test_missing_screenshots_and_gui_runs_given_to_the_swe_export_are_one_line_errors(run, tmp_path, capsys):
    path, shots_dir, shots = run
    (shots_dir / f"{shots[2]}.png").unlink()
    with pytest.raises(oa.ConfigError, match="is not in"):
        export("sft", path, tmp_path / "sft.jsonl", GuiChats(shots_dir))
    with pytest.raises(oa.ConfigError, match="no such folder"):
        GuiChats(tmp_path / "nowhere")
    # `export` writes a GUI run's own chat, which needs its screenshots
    assert cli_main(["export", "sft", str(path), "--out", str(tmp_path / "swe.jsonl"), "--screenshots", ""]) == 2
    assert "--screenshots DIR is required for a gui run" in capsys.readouterr().err
