"""The GUI recipe without a browser: actions, checks, task files, and the site servers'
guarded endpoints (served in this process on free ports)."""

from __future__ import annotations

import hashlib
import hmac
import http.cookiejar
import json
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async import ConfigError
from orchard_async.models.client import ModelConfig
from orchard_async.recipes import gui
from orchard_async.recipes.gui import actions, checks, policies, task
from orchard_async.recipes.gui.openai_policy import GuiOpenAIPolicy

INSIDE = Path(task.__file__).parent / "inside"


# -- actions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            'I open the cart.\n```json\n{"action": "click", "element": "[12]"}\n```',
            {"action": "click", "element": "12"},
        ),
        (
            '{"action": "fill", "element": 3, "text": "rain shell"}',
            {"action": "fill", "element": "3", "text": "rain shell"},
        ),
        ('Done.\nanswer(text="Elderberry")', {"action": "answer", "text": "Elderberry"}),
        ("click(x=640, y=200)", {"action": "click", "x": 640, "y": 200}),
        ('press_keys(keys=["Control+a", "Delete"])', {"action": "press_keys", "keys": ["Control+a", "Delete"]}),
    ],
)
def test_replies_parse_to_canonical_actions(reply, expected):
    assert actions.parse_text(reply) == expected


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("I think I am done", "no action found"),
        ('{"action": "fly", "to": "moon"}', "unknown action"),
        ('{"action": "click"}', "element id, or x and y"),
        ('{"action": "fill", "element": "cart", "text": "x"}', "number in [brackets]"),
        ('{"action": "goto"}', "missing url"),
        ('{"action": "click", "element": "1", "color": "red"}', "unknown field color"),
        ('```json\n{"action": "go_back"}\n```\n```json\n{"action": "go_back"}\n```', "2 JSON blocks"),
    ],
)
def test_bad_replies_are_parse_errors_that_say_why(reply, error):
    with pytest.raises(actions.ActionParseError, match=error.replace("[", r"\[").replace("]", r"\]")):
        actions.parse_text(reply)


def test_an_action_survives_the_shell_quoting_of_its_command():
    action = actions.validate({"action": "fill", "element": "7", "text": 'it\'s "quoted" $HOME `x`\nnext'})
    recorded = actions.to_action(action)
    assert recorded.command.startswith(".gui/act '")
    assert actions.action_of(recorded) == action
    assert actions.action_of(oa.Action(command="rm -rf /")) is None


def test_both_addressings_render_as_tool_schemas():
    element = {tool["function"]["name"]: tool["function"] for tool in actions.tool_schemas("element")}
    coordinates = {tool["function"]["name"]: tool["function"] for tool in actions.tool_schemas("coordinates")}
    assert element["click"]["parameters"]["required"] == ["element"]
    assert coordinates["click"]["parameters"]["required"] == ["x", "y"]
    assert {"fill", "select_option", "hover"} <= set(element) and not {"fill", "drag"} & set(element) - {"fill"}
    assert {"write", "drag", "press_keys"} <= set(coordinates) and "fill" not in coordinates
    for shared in ("goto", "go_back", "new_tab", "switch_tab", "close_tab", "wait", "answer"):
        assert shared in element and shared in coordinates


# -- checks ----------------------------------------------------------------------------------

STATE = {
    "orders": [{"items": [{"product_id": 6, "color": "red"}, {"product_id": 230, "color": "black"}], "total": 90.0}]
}


def test_state_paths_index_and_fan_out():
    assert checks.values_at(STATE, "orders.0.items.*.product_id") == [6, 230]
    assert checks.values_at(STATE, "orders.-1.items.1.color") == ["black"]
    assert checks.values_at(STATE, "orders.3.items") == []
    final = checks.Final(answer=" Elderberry. ", url="http://127.0.0.1:7103/wiki/releases", states={"shop": STATE})
    cases = [
        ({"type": "state_match", "site": "shop", "path": "orders.0.items.*.product_id", "equals": 230}, 1.0),
        ({"type": "state_match", "site": "shop", "path": "orders.0.items", "length": 3}, 0.0),
        ({"type": "string_match", "exact": "elderberry"}, 1.0),
        ({"type": "string_match", "must_include": ["elder", "fig"]}, 0.0),
        ({"type": "url_match", "contains": "/wiki/releases"}, 1.0),
        ({"type": "purchase", "product_id": 6, "options": {"color": "red"}, "qty": 2}, 2 / 3),
        ({"type": "purchase", "product_id": 6, "options": {"color": "red"}, "max_price": 50}, 0.0),
    ]
    for check, expected in cases:
        assert checks.score(check, final, {})[0] == pytest.approx(expected), check


# -- task files ------------------------------------------------------------------------------


def test_the_bundled_tasks_cover_three_sites_each_with_a_solution():
    tasks = gui.load_tasks("builtin")
    assert len(tasks) >= 36  # the issue's `--episodes 36`: one episode per bundled task
    assert len({t.id for t in tasks}) == len(tasks)
    per_site = {site: sum(1 for t in tasks if t.line.site == site) for site in task.SITES}
    assert min(per_site.values()) >= 10, per_site
    assert {t.line.site for t in tasks} == set(task.SITES)
    assert {t.line.seed for t in tasks} != {0}  # some tasks run the sites on another seed
    assert {t.line.difficulty for t in tasks} == {"easy", "medium", "hard"}
    for one in tasks:
        assert one.solution and one.solution[-1]["action"] == "answer", one.id
        assert len(one.solution) < one.max_steps, one.id  # room for the submit step
        assert one.line.start_url.startswith(f"http://127.0.0.1:{task.SITES[one.line.site]}/")
    assert [t.id for t in gui.load_tasks("builtin:forum")] == [t.id for t in tasks if t.line.site == "forum"]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("{not json", "not a valid GUI task"),
        (
            '{"id": "a", "site": "bank", "start_url": "http://x/", "intent": "i", "eval": [{"type": "url_match", "equals": "x"}]}',
            "unknown site 'bank'",
        ),
        ('{"id": "a", "site": "shop", "start_url": "http://x/", "intent": "i", "eval": []}', "at least one eval check"),
        (
            '{"id": "a", "site": "shop", "start_url": "http://x/", "intent": "i", "eval": [{"type": "state_match", "site": "shop", "path": "cart"}]}',
            "equals, contains or length",
        ),
        (
            '{"id": "a", "site": "shop", "start_url": "http://x/", "intent": "i", "eval": [{"type": "vibes"}]}',
            "type among",
        ),
        (
            '{"id": "a", "site": "shop", "start_url": "http://x/", "intent": "i", "eval": [], "colour": 1}',
            "not a valid GUI task",
        ),
    ],
)
def test_a_malformed_task_line_is_a_config_error_naming_the_line(tmp_path, line, error):
    path = tmp_path / "tasks.jsonl"
    good = json.dumps(
        {
            "id": "ok",
            "site": "forum",
            "start_url": "http://127.0.0.1:7103/",
            "intent": "i",
            "eval": [{"type": "string_match", "exact": "x"}],
        }
    )
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=rf"tasks.jsonl:2\b.*{error}"):
        gui.load_tasks(str(path))


def test_unknown_task_sources_and_policies_are_config_errors():
    with pytest.raises(ConfigError, match="no bundled GUI task"):
        gui.load_tasks("builtin:nothing-like-this")
    with pytest.raises(ConfigError, match="not 'builtin' and not a file"):
        gui.load_tasks("/no/such/tasks.jsonl")
    with pytest.raises(ConfigError, match="choose one of: oracle, empty, openai"):
        gui.make_policy("random")


def test_the_sandbox_side_agrees_on_ports_and_ships_every_file():
    sys.path.insert(0, str(INSIDE))
    try:
        import start

        assert start.PORTS == task.SITES
    finally:
        sys.path.remove(str(INSIDE))
        sys.modules.pop("start", None)
    files = task.inside_files()
    assert {"act", "browserd.py", "start.py", "common.py", "sites/server.py", "sites/web.py"} <= set(files)
    assert {"sites/shop.py", "sites/booking.py", "sites/forum.py"} <= set(files)


# -- policies without a browser --------------------------------------------------------------


def _observation(
    history, task_object=None, instruction='Find it.\n\nThe browser shows:\nfeedback: opened\n---\n[3] link "Cart"\n'
):
    return oa.Observation("ep-1", task_object or object(), instruction, len(history), list(history))


def test_the_oracle_resolves_targets_by_role_and_name():
    page = 'feedback: x\n---\n[4] RootWebArea "Shop"\n  [9] link "Cart"\n  [12] button "Add to cart"\n  [13] button "Add to cart"\n'
    assert policies.resolve({"role": "button", "name": "Add to cart", "nth": 1}, page) == "13"
    assert policies.resolve({"role": "link", "contains": "Car"}, page) == "9"
    with pytest.raises(LookupError):
        policies.resolve({"role": "link", "name": "Checkout"}, page)


def test_gui_tasks_end_after_three_format_errors_in_a_row_and_an_answer_submits():
    (task,) = gui.load_tasks("builtin:shop-add-tote")
    assert task.parse_failure_limit == 3  # the episode loop ends it as parse_failures (tests/core/test_rollout.py)
    answer = actions.to_action({"action": "answer", "text": "Fig"})
    answered = [oa.Step(index=0, action=answer, observation='feedback: answer recorded: "Fig"\nurl: x\n---\n')]
    policy = GuiOpenAIPolicy(ModelConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    assert anyio.run(policy.act, _observation(answered)).kind == "submit"


def test_the_policy_and_the_tasks_read_their_screenshot_and_marks_settings_apart(monkeypatch, tmp_path):
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "ORCHARD_MODEL": "m"}
    policy = GuiOpenAIPolicy.from_env(env | {"ORCHARD_GUI_LAST_SCREENSHOTS": "1", "ORCHARD_GUI_MARKS": "1"})
    assert policy.screenshots == 1 and "set-of-marks" in policy.system_prompt
    plain = GuiOpenAIPolicy.from_env(env | {"ORCHARD_GUI_SCREENSHOTS": str(tmp_path)})  # the folder: not a count
    assert plain.screenshots == 3 and "set-of-marks" not in plain.system_prompt
    with pytest.raises(oa.ConfigError, match="ORCHARD_GUI_MARKS"):
        GuiOpenAIPolicy.from_env(env | {"ORCHARD_GUI_MARKS": "maybe"})
    monkeypatch.setenv("ORCHARD_GUI_MARKS", "1")
    monkeypatch.setenv("ORCHARD_GUI_SCREENSHOTS", str(tmp_path))
    (task,) = gui.load_tasks("builtin:shop-add-tote")
    assert task.marks and task.screenshot_dir == tmp_path


def test_the_model_sees_text_for_each_step_and_at_most_k_screenshots():
    digests = [hashlib.sha256(bytes([i])).hexdigest() for i in range(5)]

    class FakeTask:
        async def screenshot(self, episode_id, digest):
            return b"\x89PNG" + digest.encode()

    steps = [
        oa.Step(
            index=i,
            action=actions.to_action({"action": "scroll", "direction": "down"}, raw=f"reply {i}"),
            observation=f"feedback: scrolled down\nscreenshot: sha256={digests[i]} 1280x720 9 bytes\n---\n",
        )
        for i in range(5)
    ]
    policy = GuiOpenAIPolicy(ModelConfig(model="m", base_url="http://127.0.0.1:9/v1"), screenshots=2)
    messages = anyio.run(policy.build_messages, _observation(steps, FakeTask()))
    assert messages[0]["role"] == "system" and "click(element" in messages[0]["content"]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == [f"reply {i}" for i in range(5)]
    images = [p for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]
    assert len(images) == 2
    assert images[-1]["image_url"]["url"].startswith("data:image/png;base64,")
    omitted = [m for m in messages if isinstance(m["content"], str) and "screenshot omitted" in m["content"]]
    assert len(omitted) == 3
    # the encodings are kept for the episode's next turns, and go when the engine says it ended
    assert list(policy._images) == ["ep-1"]
    policy.episode_ended("ep-1")
    assert policy._images == {}


# -- the sites' guarded endpoints --------------------------------------------------------------


@pytest.fixture(scope="module")
def sites():
    """The three sites served in this process on free ports, with a fresh key."""
    for path in (str(INSIDE), str(INSIDE / "sites")):
        sys.path.insert(0, path)
    import booking
    import forum
    import shop
    import web

    key = secrets.token_bytes(32)
    servers = {
        name: web.serve(cls(), 0, key)
        for name, cls in (("shop", shop.Shop), ("booking", booking.Booking), ("forum", forum.Forum))
    }
    yield {name: f"http://127.0.0.1:{server.server_address[1]}" for name, server in servers.items()}, key, web
    for server in servers.values():
        server.shutdown()
    for path in (str(INSIDE), str(INSIDE / "sites")):
        sys.path.remove(path)
    for name in ("booking", "forum", "shop", "web", "common"):
        sys.modules.pop(name, None)


def _fetch(url, data=None, cookie=None):
    request = urllib.request.Request(url, data=urllib.parse.urlencode(data).encode() if data else None)
    if cookie:
        request.add_header("Cookie", cookie)
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    try:
        with opener.open(request, timeout=10) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def _signed_state(base, key):
    nonce = secrets.token_hex(8)
    sig = hmac.new(key, f"request\nstate\n{nonce}".encode(), hashlib.sha256).hexdigest()
    status, body, headers = _fetch(f"{base}/__state?nonce={nonce}&sig={sig}")
    assert status == 200
    expected = hmac.new(key, nonce.encode() + b"\n" + body.encode(), hashlib.sha256).hexdigest()
    assert headers["X-Orchard-Signature"] == expected
    return json.loads(body)


def test_control_endpoints_answer_only_signed_requests(sites):
    urls, key, _ = sites
    assert _fetch(urls["shop"] + "/__health")[:2] == (200, "ok")
    assert _fetch(urls["shop"] + "/__state")[0] == 403
    assert _fetch(urls["shop"] + "/__state?nonce=abc&sig=" + "0" * 64)[0] == 403
    assert _fetch(urls["booking"] + "/__reset?seed=3&nonce=abc&sig=" + "0" * 64)[0] == 403
    assert _fetch(urls["shop"] + "/__admin")[0] == 404
    assert _signed_state(urls["shop"], key) == {"cart": [], "orders": []}


def test_changes_are_accepted_only_from_the_episode_browser(sites):
    urls, key, web = sites
    item = {"product_id": "6", "color": "white", "qty": "1"}
    assert _fetch(urls["shop"] + "/cart/add", item)[0] == 403
    assert _fetch(urls["shop"] + "/cart/add", item, cookie=f"{web.BROWSER_COOKIE}=forged")[0] == 403
    status, body, _ = _fetch(urls["shop"] + "/cart/add", item, cookie=f"{web.BROWSER_COOKIE}={web.browser_token(key)}")
    assert status == 200 and "Lumen Falcon Tote" in body  # redirected to the cart
    assert [i["product_id"] for i in _signed_state(urls["shop"], key)["cart"]] == [6]


def test_sites_are_deterministic_per_seed(sites):
    for path in (str(INSIDE), str(INSIDE / "sites")):
        sys.path.insert(0, path) if path not in sys.path else None
    import booking
    import shop

    assert shop.generate_catalog(0) == shop.generate_catalog(0)
    assert shop.generate_catalog(0) != shop.generate_catalog(1)
    assert len(shop.generate_catalog(0)) == 300
    assert booking.taken_slots(2) == booking.taken_slots(2) != booking.taken_slots(3)


# -- doctor ------------------------------------------------------------------------------------


def _fake_browser(path, script):
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def test_doctor_names_the_chromium_the_driver_would_start(tmp_path, monkeypatch):
    fake = _fake_browser(tmp_path / "chromium", 'echo "FakeChromium 1.2.3"')
    monkeypatch.setenv("ORCHARD_CHROMIUM", str(fake))
    assert gui.doctor() == {"chromium (local adapter)": f"FakeChromium 1.2.3 at {fake}"}
    broken = _fake_browser(tmp_path / "broken", "echo 'libfoo.so: cannot open' >&2; exit 3")
    monkeypatch.setenv("ORCHARD_CHROMIUM", str(broken))
    line = gui.doctor()["chromium (local adapter)"]
    assert line.startswith(f"found at {broken}, but `--version` failed") and "libfoo" in line
