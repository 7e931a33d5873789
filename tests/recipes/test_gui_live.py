"""Live-site tasks (WebVoyager, Online-Mind2Web, DeepShop) in the GUI schema, and the llm_judge check
over real HTTP against a scripted judge. Parse and judge only: live sites never run here."""

from __future__ import annotations

import json

import anyio
import pytest

from orchard_async import ConfigError, VerifierError
from orchard_async.recipes import gui
from orchard_async.recipes.gui import checks, judge, live
from tests.recipes.swe_support import chat_reply

WEBVOYAGER = [
    {
        "web_name": "Allrecipes",
        "id": "Allrecipes--0",
        "ques": "Provide a recipe for vegetarian lasagna.",
        "web": "https://www.allrecipes.com/",
    },
    {
        "web_name": "GitHub",
        "id": "GitHub--3",
        "ques": "Find the most starred Python repository.",
        "web": "https://github.com/",
    },
]
MIND2WEB = [
    {
        "task_id": "ade4c09ad3fdb1607209750924cd232f",
        "confirmed_task": "Compare two phones on the site.",
        "website": "https://www.gsmarena.com/",
        "reference_length": 7,
        "level": "medium",
    },
    {
        "task_id": "b7258ee05d75e6c50673a59914db412e",
        "confirmed_task": "Find a one-way flight.",
        "website": "www.united.com",
        "reference_length": 12,
        "level": "hard",
    },
]


@pytest.fixture
def judged(monkeypatch):
    monkeypatch.setenv("ORCHARD_JUDGE_MODEL", "judge-model")
    monkeypatch.setenv("ORCHARD_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")


def test_webvoyager_and_mind2web_files_load_as_judged_live_tasks(tmp_path, judged):
    voyager = tmp_path / "WebVoyager_data.jsonl"
    voyager.write_text("".join(json.dumps(r) + "\n" for r in WEBVOYAGER))
    mind2web = tmp_path / "Online_Mind2Web.json"
    mind2web.write_text(json.dumps(MIND2WEB))
    tasks = gui.load_tasks(f"webvoyager:{voyager}") + gui.load_tasks(f"mind2web:{mind2web}")
    assert [t.id for t in tasks] == ["Allrecipes--0", "GitHub--3", MIND2WEB[0]["task_id"], MIND2WEB[1]["task_id"]]
    assert [t.line.start_url for t in tasks][-1] == "https://www.united.com"
    assert [t.line.difficulty for t in tasks][2:] == ["medium", "hard"]
    for task in tasks:
        assert task.spec.network == "on" and task.line.network == "on"
        assert task.line.eval == [{"type": "llm_judge"}] and task.judge is not None
        assert task.score_timeout >= 120
    assert tasks[0].judge is tasks[1].judge  # one judge (one HTTP client) per load
    assert all(t.spec.network == "none" for t in gui.load_tasks("builtin:forum"))


def test_live_files_with_a_missing_field_or_no_judge_are_config_errors(tmp_path, monkeypatch, judged):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(WEBVOYAGER[0]) + "\n" + json.dumps({"id": "x", "web": "https://a.example/"}) + "\n")
    with pytest.raises(ConfigError, match="bad.jsonl:2: missing 'web_name'"):
        gui.load_tasks(f"webvoyager:{bad}")
    with pytest.raises(ConfigError, match="no such file"):
        gui.load_tasks(f"mind2web:{tmp_path / 'absent.json'}")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(WEBVOYAGER[0]) + "\n")
    monkeypatch.delenv("ORCHARD_JUDGE_MODEL")
    with pytest.raises(ConfigError, match="ORCHARD_JUDGE_MODEL"):
        gui.load_tasks(f"webvoyager:{good}")


DEEPSHOP = {
    "web_name": "Amazon",
    "id": "Amazon--7",
    "ques": "Find a USB-C hub with at least 4 ports under $40 rated 4 stars or more, and pick the best seller.",
    "web": "https://www.amazon.com/?language=en_US&currency=USD",
    "attribute": "USB-C hub with at least 4 ports",
    "filter": "USB-C hub under $40 rated 4 stars or more",
    "sort": "USB-C hub sorted by best sellers",
    "category": "Electronics",
    "difficulty": "medium",
}


def test_deepshop_lines_are_live_judged_tasks_or_on_the_bundled_shop_scored_by_program(tmp_path, judged):
    path = tmp_path / "deepshop_test.jsonl"
    path.write_text(json.dumps(DEEPSHOP) + "\n" + json.dumps(DEEPSHOP | {"id": "Amazon--8", "difficulty": "?"}) + "\n")
    judged_tasks = gui.load_tasks(f"deepshop:{path}")
    assert [(t.id, t.line.site, t.line.difficulty) for t in judged_tasks] == [
        ("Amazon--7", "Amazon", "medium"),
        ("Amazon--8", "Amazon", "medium"),
    ]
    assert all(t.spec.network == "on" and t.line.eval == [{"type": "llm_judge"}] and t.judge for t in judged_tasks)
    offline = gui.load_tasks("deepshop:builtin")  # the converted examples: DeepShop's fields plus our checks
    assert len(offline) >= 4 and {t.line.difficulty for t in offline} == {"easy", "medium", "hard"}
    for task in offline:
        assert task.line.site == "shop" and task.spec.network == "none" and task.judge is None
        assert task.line.start_url.startswith("http://127.0.0.1:7101/") and task.solution
        assert all(check["type"] != "llm_judge" for check in task.line.eval)
    source = [json.loads(line) for line in live.deepshop_builtin_path().read_text().splitlines()]
    assert all({"attribute", "filter", "sort", "category", "ques", "web", "web_name"} <= set(r) for r in source)
    unscored = tmp_path / "unscored.jsonl"
    unscored.write_text(json.dumps(DEEPSHOP | {"web": "http://127.0.0.1:7101/"}) + "\n")
    with pytest.raises(ConfigError, match="unscored.jsonl:1: a DeepShop task on the bundled shop site needs 'eval'"):
        gui.load_tasks(f"deepshop:{unscored}")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(DEEPSHOP | {"web": "http://127.0.0.1:7101/", "eval": [{"type": "nope"}]}) + "\n")
    with pytest.raises(ConfigError, match="broken.jsonl:1 eval\\[0\\]"):
        gui.load_tasks(f"deepshop:{broken}")


def test_verdicts_are_read_the_way_webvoyager_writes_them():
    assert judge.verdict("The cart shows it. SUCCESS") is True
    assert judge.verdict("The page shows no recipe.\nNOT SUCCESS") is False
    assert judge.verdict("I cannot tell.") is None


def test_the_judge_sees_task_answer_and_screenshots_over_http(chat_server, tmp_path, monkeypatch, judged):
    replies = ["The screenshots show the recipe page.\n\nSUCCESS", "Nothing matches.\n\nNOT SUCCESS", "Hmm."]
    server = chat_server(lambda request, index: chat_reply(replies[index]))
    monkeypatch.setenv("ORCHARD_JUDGE_BASE_URL", server.base_url)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(WEBVOYAGER[0]) + "\n")
    (task,) = gui.load_tasks(f"webvoyager:{good}")

    class Shots:  # stands in for the sandbox: the screenshots the driver listed
        async def read_file(self, path):
            return b"\x89PNG fake " + path.encode()

    digests = [f"{i:064x}" for i in range(5)]
    final = checks.Final(answer="Spinach lasagna, 4.8 stars", url="https://www.allrecipes.com/recipe/1")

    async def three_verdicts():
        try:
            first = await task._judge(Shots(), final, digests)
            second = await task._judge(Shots(), final, digests)
            with pytest.raises(VerifierError, match="no verdict"):
                await task._judge(Shots(), final, digests)
            return first, second
        finally:
            await task.judge.close()

    first, second = anyio.run(three_verdicts)
    assert first[0] == 1.0 and second[0] == 0.0
    body = server.requests[0]["json"]
    assert body["model"] == "judge-model" and body["messages"][0]["content"] == judge.SYSTEM_PROMPT
    parts = body["messages"][1]["content"]
    assert "TASK: Provide a recipe for vegetarian lasagna." in parts[0]["text"]
    assert "Result Response: Spinach lasagna, 4.8 stars" in parts[0]["text"]
    assert len(parts) == 1 + judge.SCREENSHOTS and all(p["type"] == "image_url" for p in parts[1:])
