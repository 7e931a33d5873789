"""The GUI recipe with a real headless Chromium in local sandboxes: observations, bad
input, whole episodes (oracle, empty, a model over HTTP), and agents that try to forge
their reward. Skipped without Chromium on users' machines; a failure in CI (CI=true)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import pytest

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.models.client import ModelConfig
from orchard_async.recipes import gui
from orchard_async.recipes.gui import actions, checks, policies
from orchard_async.recipes.gui.export import GuiChats, export
from orchard_async.recipes.gui.openai_policy import GuiOpenAIPolicy
from tests.conftest import backend_missing
from tests.recipes.swe_support import ScriptPolicy, chat_reply, run_rollout


def _chromium() -> str | None:
    for candidate in (os.environ.get("ORCHARD_CHROMIUM"), "/usr/lib/chromium/chromium", "chromium", "chromium-browser"):
        if candidate and (shutil.which(candidate) or os.access(candidate, os.X_OK)):
            return candidate
    return None


@pytest.fixture(scope="module", autouse=True)
def needs_chromium():
    if _chromium() is None:
        backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking that its image data inflates to that size."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, header = 8, b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        offset += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    channels = {2: 3, 6: 4, 0: 1, 4: 2}[color]
    assert depth == 8 and len(zlib.decompress(idat)) == height * (1 + width * channels)
    return width, height


def _shot(page: str) -> str:
    line = next(line for line in page.splitlines() if line.startswith("screenshot: sha256="))
    return line.split("=", 1)[1].split()[0]


# -- one browser for the observation tests -------------------------------------------------


@dataclass
class Live:
    portal: Any
    box: Any
    task: Any
    page: str

    def act(self, action: Any) -> str:
        command = actions.command(action) if isinstance(action, dict) else f"{actions.CLIENT} {action}"
        result = self.portal.call(lambda: self.box.exec(command, timeout=30))
        assert result.ok, result.error_text
        return result.text


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with anyio.from_thread.start_blocking_portal() as portal:
        adapter = LocalAdapter(root=tmp_path_factory.mktemp("gui-browser"))
        (task,) = gui.load_tasks("builtin:booking-dental")
        box = portal.call(adapter.create, oa.SandboxSpec(ttl=600))
        try:
            instruction = portal.call(task.setup, box)
            yield Live(portal, box, task, instruction.partition("The browser shows:\n")[2])
        finally:
            portal.call(box.close)
            portal.call(adapter.close)


def test_a_screenshot_is_a_png_of_the_viewport_and_the_tree_names_the_widgets(live):
    data = live.portal.call(live.box.read_file, f".gui/run/shots/{_shot(live.page)}.png")
    assert _png_size(data) == (1280, 720)
    tree = live.page.partition("\n---\n")[2]
    for widget in (
        'heading "Book an appointment"',
        'combobox "Service"',
        'combobox "Practitioner"',
        'Date "Date"',
        'combobox "Time"',
        'button "Continue"',
        'link "My bookings"',
    ):
        assert widget in tree, widget
    assert live.page.startswith("feedback: opened http://127.0.0.1:7102/book")
    assert (
        "url: http://127.0.0.1:7102/book\n" in live.page
        and "tabs: *[0] Book an appointment - Lakeside Clinic" in live.page
    )


def test_widgets_are_driven_by_element_id(live):
    page = live.act({"action": "goto", "url": "http://127.0.0.1:7102/book"})  # a new document: new ids
    page = live.act(
        {
            "action": "select_option",
            "element": policies.resolve({"role": "combobox", "name": "Service"}, page),
            "option": "Eye exam",
        }
    )
    assert page.startswith('feedback: selected "Eye exam"') and 'combobox "Service" value="Eye exam"' in page
    wrong = live.act(
        {
            "action": "select_option",
            "element": policies.resolve({"role": "combobox", "name": "Time"}, page),
            "option": "25:00",
        }
    )
    assert wrong.startswith("feedback: error: cannot select") and '"09:30"' in wrong.split("\n", 1)[0]
    page = live.act(
        {"action": "fill", "element": policies.resolve({"role": "Date", "name": "Date"}, page), "text": "2026-03-09"}
    )
    assert 'spinbutton "Day Day" value="9"' in page or 'value="9"' in page
    page = live.act({"action": "click", "element": policies.resolve({"role": "button", "name": "Continue"}, page)})
    assert "Choose a practitioner" in page or "does not offer" in page  # the site's own validation error
    assert page.split("\n", 1)[0].startswith("feedback: clicked")


def test_bad_actions_are_feedback_and_the_driver_stays_up(live):
    cases = [
        ({"action": "click", "element": "987654"}, "error: no element [987654] on this page"),
        ({"action": "goto", "url": "https://example.com/"}, "example.com is outside this environment"),
        ({"action": "goto", "url": "javascript:alert(1)"}, "only http(s) URLs"),
        ({"action": "switch_tab", "index": 7}, "no tab 7"),
        ({"action": "close_tab", "index": 0}, "the last tab stays open"),
        ({"action": "fly"}, "unknown action 'fly'"),
    ]
    for action, feedback in cases:
        first_line = live.act(action).split("\n", 1)[0]
        assert first_line.startswith("feedback: error:") and feedback in first_line, (action, first_line)
    assert live.act("'this is not json'").startswith("error: the request is not a JSON object")
    assert live.act({"action": "wait", "seconds": 0}).startswith("feedback: waited")


def test_tabs_open_switch_and_close(live):
    page = live.act({"action": "new_tab", "url": "http://127.0.0.1:7103/wiki/releases"})
    assert "tabs: [0] " in page and "*[1] Release history - Orchard OS Community" in page
    assert 'cell "Elderberry"' in page
    page = live.act({"action": "switch_tab", "index": 0})
    assert "*[0] " in page and "url: http://127.0.0.1:7102/" in page
    page = live.act({"action": "close_tab", "index": 1})
    assert "[1]" not in page.split("tabs: ", 1)[1].split("\n", 1)[0]


# -- whole episodes ---------------------------------------------------------------------------

ONE_PER_SITE = "builtin:shop-add-tote,booking-cancel-eye,forum-codename"


@pytest.mark.soak  # an oracle and an empty episode per site in Chromium (~20 s); CI runs soak
def test_oracle_solves_and_empty_fails_one_task_per_site(tmp_path):
    tasks = gui.load_tasks(ONE_PER_SITE)
    for task in tasks:
        task.screenshot_dir = tmp_path / "screenshots"
    oracle = anyio.run(run_rollout, tasks, gui.make_policy("oracle"), tmp_path / "oracle")
    empty = anyio.run(run_rollout, tasks, gui.make_policy("empty"), tmp_path / "empty")
    for run in (oracle, empty):
        assert run.leaked == [] and run.left_on_disk == []
        assert all(t.status == "finished" and t.end_reason == "submitted" for t in run.trajectories), [
            t.error for t in run.trajectories
        ]
    assert [t.reward for t in oracle.trajectories] == [1.0, 1.0, 1.0], [t.info for t in oracle.trajectories]
    assert [t.reward for t in empty.trajectories] == [0.0, 0.0, 0.0]
    kept = {path.stem for path in (tmp_path / "screenshots").iterdir()}
    for trajectory in oracle.trajectories:
        for step in trajectory.steps[:-1]:  # the last is the submit
            assert len(step.observation) < 16_000 and "base64" not in step.observation
            assert _shot(step.observation) in kept  # referenced by hash, stored beside the run
    assert _png_size((tmp_path / "screenshots" / f"{sorted(kept)[0]}.png").read_bytes()) == (1280, 720)
    # The run's screenshots become the training chats' images.
    summary = export("sft", oracle.trajectories, tmp_path / "sft.jsonl", GuiChats(tmp_path / "screenshots"))
    records = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert summary.records == 3 and all(1 <= len(record["images"]) <= 3 for record in records)
    for record in records:
        urls = [url for m in record["messages"] for url in m["image_urls"]]
        images = [base64.b64decode(url.split(",", 1)[1]) for url in urls if url.startswith("data:image/png;base64,")]
        assert len(images) == len(record["images"]) and all(_png_size(image) == (1280, 720) for image in images)


def test_a_converted_deepshop_task_runs_offline_on_the_bundled_shop(tmp_path):
    tasks = [task for task in gui.load_tasks("deepshop:builtin") if task.id == "deepshop-shop-reviewed-kitchen"]
    oracle = anyio.run(run_rollout, tasks, gui.make_policy("oracle"), tmp_path / "oracle")
    assert [t.reward for t in oracle.trajectories] == [1.0], [t.info for t in oracle.trajectories]
    assert oracle.leaked == [] and oracle.trajectories[0].info["checks"][0]["type"] == "string_match"


DIRECT_HTTP = """python3 - <<'EOF'
import urllib.request, urllib.error
def status(url, data=None):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code
print("add", status("http://127.0.0.1:7101/cart/add", b"product_id=6&color=white&qty=1"))
print("state", status("http://127.0.0.1:7101/__state?nonce=n&sig=s"))
print("reset", status("http://127.0.0.1:7101/__reset?seed=0"))
EOF"""
WRITE_STATE = (
    """echo '{"cart": [{"product_id": 6, "color": "white", "qty": 1}]}' > .gui/run/state.json && echo written"""
)
FORGED = {
    "cart": [{"product_id": 68, "color": "blue", "size": "L", "qty": 2, "title": "x", "price": 1.0}],
    "orders": [],
}
REPLACE_SERVER = (
    "for p in /proc/[0-9]*; do grep -q 'sites/server.py' $p/cmdline 2>/dev/null && kill ${p#/proc/}; done; sleep 0.5; "
    "cat > fake.py <<'EOF'\n"
    "import http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    f"        body = b'ok' if self.path == '/__health' else {json.dumps(json.dumps(FORGED))!s}.encode()\n"
    "        self.send_response(200); self.send_header('X-Orchard-Signature', 'f' * 64)\n"
    "        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
    "http.server.HTTPServer(('127.0.0.1', 7101), H).serve_forever()\n"
    "EOF\n"
    "(setsid python3 fake.py >/dev/null 2>&1 &); sleep 0.5; "
    "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:7101/__state').read().decode())\""
)


def test_agents_cannot_forge_the_state_the_grader_reads(tmp_path):
    tasks = gui.load_tasks("builtin:shop-add-tote,shop-fleece-size")
    cheater = ScriptPolicy(
        {"shop-add-tote": [DIRECT_HTTP, WRITE_STATE], "shop-fleece-size": [REPLACE_SERVER]}, name="cheater"
    )
    run = anyio.run(run_rollout, tasks, cheater, tmp_path / "root")
    assert run.leaked == [] and run.left_on_disk == []
    direct, forged = run.by_task()["shop-add-tote"], run.by_task()["shop-fleece-size"]
    assert direct.steps[0].observation.split() == ["add", "403", "state", "403", "reset", "403"]
    assert direct.status == "finished" and direct.reward == 0.0 and "tampered" not in direct.info
    assert '"product_id": 68' in forged.steps[0].observation  # the fake server was up and answering
    assert forged.status == "finished" and forged.reward == 0.0 and forged.info["tampered"] == ["shop"]
    # Control: the forged state does satisfy the task's checks; only its signature gives it away.
    (fleece,) = gui.load_tasks("builtin:shop-fleece-size")
    final = checks.Final(answer=None, url="", states={"shop": FORGED})
    assert all(checks.score(check, final, {})[0] == 1.0 for check in fleece.line.eval)


def test_a_model_over_http_sees_screenshots_and_the_tree_and_solves_a_task(tmp_path, chat_server):
    (task,) = gui.load_tasks("builtin:forum-codename")

    def reply(request: dict[str, Any], index: int):
        if index == 0:
            return chat_reply("Let me think about where the release list could be.")  # no action: a format error
        valid = sum(1 for m in request["messages"] if m["role"] == "assistant" and "```json" in m["content"])
        planned = dict(task.solution[valid])
        texts = [
            m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in request["messages"]
        ]
        text = next(t for t in reversed(texts) if "\n---\n" in t)  # the latest page (not a format error)
        if "target" in planned:
            planned["element"] = policies.resolve(planned.pop("target"), text)
        return chat_reply(f"Next step.\n```json\n{json.dumps(planned)}\n```")

    server = chat_server(reply)
    policy = GuiOpenAIPolicy(ModelConfig(model="test-model", base_url=server.base_url, max_retries=0), screenshots=2)

    async def episode():
        try:
            return await run_rollout([task], policy, tmp_path / "root")
        finally:
            await policy.close()

    run = anyio.run(episode)
    (trajectory,) = run.trajectories
    assert trajectory.reward == 1.0 and trajectory.success, (trajectory.error, trajectory.info)
    assert trajectory.steps[0].action.kind == "invalid"
    bodies = [request["json"] for request in server.requests]
    assert "Format error" in json.dumps(bodies[1]["messages"][-1])
    for body in bodies:
        images = [
            p
            for m in body["messages"]
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "image_url"
        ]
        assert 1 <= len(images) <= 2
        png = base64.b64decode(images[-1]["image_url"]["url"].split(",", 1)[1])
        assert _png_size(png) == (1280, 720)
    last_page = bodies[-1]["messages"][-1]["content"][0]["text"]
    assert 'cell "Elderberry"' in last_page  # the model answered from the table it was shown
    assert run.leaked == []


def test_a_model_that_never_gives_an_action_ends_parse_failures_and_is_scored(tmp_path, chat_server):
    (task,) = gui.load_tasks("builtin:forum-codename")
    server = chat_server(lambda request, index: chat_reply("I am not sure what to do here."))
    policy = GuiOpenAIPolicy(ModelConfig(model="test-model", base_url=server.base_url, max_retries=0))

    async def episode():
        try:
            return await run_rollout([task], policy, tmp_path / "root")
        finally:
            await policy.close()

    run = anyio.run(episode)
    (trajectory,) = run.trajectories
    assert (trajectory.status, trajectory.end_reason, trajectory.reward) == ("finished", "parse_failures", 0.0)
    assert [step.action.kind for step in trajectory.steps] == ["invalid"] * 3 and len(server.requests) == 3
    assert trajectory.info["checks"] and not trajectory.retries and run.leaked == []  # scored, never retried
