"""The `llm_judge` check against a scripted judge over real HTTP: its verdict counts in the
completion, the judge sees the request, the rubric, the answer and the tool calls; a judge that
fails or gives no verdict makes the episode a verifier error, never a reward; without a judge
the check is left out."""

from __future__ import annotations

import json

import anyio

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.models.client import ModelConfig
from orchard_async.recipes import claw
from orchard_async.recipes.claw.judge import ClawJudge
from tests.recipes.swe_support import Reply, chat_reply

TASK = """\
id: judged-{name}
prompt: Tell me politely that the report is late.
services: {{notes: {{notes: []}}}}
checks:
  - {{type: answer, match: {{contains: report}}}}
  - {{type: llm_judge, rubric: "{name}: the answer is polite", weight: 3, label: polite}}
oracle: ['claw answer "Sorry, the report is late."']
"""

VERDICTS = {
    "pass": chat_reply("The answer apologises and is courteous.\nPASS"),
    "fail": chat_reply("It is curt.\nFAIL"),
    "mute": chat_reply("I cannot tell."),
    "down": Reply(500, {"error": "overloaded"}),
}


def judge_reply(request: dict, index: int) -> Reply:
    return VERDICTS[request["messages"][1]["content"].split("RUBRIC:\n")[1].split(":")[0]]


def test_the_judges_verdict_counts_and_its_failure_is_a_verifier_error(chat_server, tmp_path) -> None:
    server = chat_server(judge_reply)
    judge = ClawJudge(ModelConfig(model="judge", base_url=server.base_url, max_retries=0))
    tasks = []
    for name in [*VERDICTS, "off"]:
        (tmp_path / f"{name}.yaml").write_text(TASK.format(name=name))
        task = claw.load_task(tmp_path / f"{name}.yaml")
        task.judge = judge if name != "off" else None
        tasks.append(task)

    async def main():
        adapter = LocalAdapter(root=tmp_path / "root")
        try:  # no retries: a verifier error would be retried with a back-off, to the same end
            return [
                t async for t in oa.rollout(tasks, claw.make_policy("oracle"), adapter, concurrency=5, max_retries=0)
            ]
        finally:
            await adapter.close()

    by_task = {t.task_id.removeprefix("judged-"): t for t in anyio.run(main)}
    passed, failed = by_task["pass"], by_task["fail"]
    assert (passed.reward, passed.info["checks"]["polite"]) == (1.0, True)
    assert passed.info["judge"]["polite"].endswith("PASS")
    assert failed.info["checks"]["polite"] is False and failed.info["completion"] == 0.25  # 1 of weight 4
    assert failed.reward < 0.75
    off = by_task["off"]
    assert off.info["checks"]["polite"] is None and off.reward == 1.0  # left out without a judge
    for name in ("mute", "down"):
        t = by_task[name]
        assert (t.status, t.end_reason) == ("failed", "verifier_error"), (name, t.status, t.end_reason, t.error)
        assert "llm_judge" in t.error
    sent = next(r for r in server.requests if "pass: the answer is polite" in json.dumps(r["json"]))
    content = sent["json"]["messages"][1]["content"]
    assert "Tell me politely" in content and "Sorry, the report is late." in content
    assert 'agent.answer {"text": "Sorry, the report is late."} -> ok' in content


def test_a_judge_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("ORCHARD_JUDGE_MODEL", raising=False)
    (task,) = claw.load_tasks("builtin:mail-reply-dana", user_base_url="")
    assert task.judge is None
    monkeypatch.setenv("ORCHARD_JUDGE_MODEL", "judge-model")
    monkeypatch.setenv("ORCHARD_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    (task,) = claw.load_tasks("builtin:mail-reply-dana", user_base_url="")
    assert isinstance(task.judge, ClawJudge) and task.judge.config.model == "judge-model"
