"""The bash-only harness (reply parsing, truncation, conversation rebuild) and test-outcome parsing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe.agent import render_observation, truncate_middle
from orchard_async.recipes.swe.policies import gold_patch_command
from orchard_async.recipes.swe.scoring import grade, parse_test_outcomes, revert_script


def test_parse_reply():
    action = swe.parse_reply("THOUGHT: look\n\n```bash\nls -la\n```\n")
    assert (action.kind, action.command, action.raw) == ("exec", "ls -la", "THOUGHT: look\n\n```bash\nls -la\n```\n")
    multi = swe.parse_reply("```bash\ncat <<'EOF' > f.py\nx = 1\nEOF\npython3 f.py\n```")
    assert multi.kind == "exec" and multi.command == "cat <<'EOF' > f.py\nx = 1\nEOF\npython3 f.py"
    assert swe.parse_reply("```sh\necho hi\n```").command == "echo hi"
    assert swe.parse_reply("done\n```bash\nsubmit\n```").kind == "submit"
    assert swe.parse_reply("```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff\n```").kind == "submit"
    for text, error in [
        ("no block here", "found no ```bash block"),
        ("```bash\nls\n```\n```bash\npwd\n```", "found 2 ```bash blocks"),
        ("```python\nprint(1)\n```", "found no ```bash block"),
        ("```bash\n  \n```", "the ```bash block is empty"),
    ]:
        bad = swe.parse_reply(text)
        assert bad.kind == "invalid" and error in bad.error and bad.raw == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=10, max_value=200))
def test_truncate_middle_keeps_head_and_tail(text, limit):
    out = truncate_middle(text, limit)
    if len(text) <= limit:
        assert out == text
    else:
        assert out.startswith(text[: limit // 2]) and out.endswith(text[-(limit - limit // 2) :])
        assert f"[... {len(text) - limit} characters elided" in out


def test_observation_messages():
    step = oa.Step(index=0, action=oa.Action(command="x"), observation="a" * 50_000, exit_code=1, reason="nonzero")
    message = render_observation(step, limit=1000)
    assert message.startswith("<returncode>1</returncode>\n<output>\n") and message.endswith("</output>")
    assert "49000 characters elided" in message and len(message) < 1200
    timeout = oa.Step(index=0, action=oa.Action(command="x"), observation="", exit_code=137, reason="timeout")
    assert "timed out" in render_observation(timeout)
    invalid = oa.Step(index=0, action=oa.Action(kind="invalid", raw="hmm", error="found no ```bash block"))
    assert render_observation(invalid).startswith("Format error: found no ```bash block")


def test_build_messages_alternates_and_skips_unreadable_replies():
    steps = [
        oa.Step(index=0, action=oa.Action(kind="invalid", raw="thinking...", error="found no ```bash block")),
        oa.Step(index=1, action=oa.Action(kind="invalid", error="malformed response: no choices")),
        oa.Step(index=2, action=oa.Action(command="ls"), observation="a.py\n", exit_code=0, reason="ok"),
        oa.Step(index=3, action=oa.Action(kind="submit")),
    ]
    messages = swe.build_messages("fix it", steps)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == swe.SYSTEM_PROMPT and messages[1]["content"] == "fix it"
    assert messages[4]["content"].endswith("```bash\nls\n```")  # canonical reply for scripted steps
    assert messages[5]["content"] == "<returncode>0</returncode>\n<output>\na.py\n</output>"
    assert messages[6]["content"].endswith("```bash\nsubmit\n```")


def test_gold_patch_command_survives_a_delimiter_in_the_patch():
    patch = "ORCHARD_PATCH\nORCHARD_PATCH_1\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+ORCHARD_PATCH\n"
    command = gold_patch_command(patch)
    assert "<<'ORCHARD_PATCH_2'" in command and command.endswith("\nORCHARD_PATCH_2")


def test_parse_test_outcomes():
    output = "\n".join(
        [
            "tests/test_a.py::test_x PASSED  [ 50%]",
            "PASSED tests/test_a.py::test_not_in_summary",
            "=========================== short test summary info ============================",
            "PASSED tests/test_a.py::test_x",
            "PASSED tests/test_a.py::test_p[a - b]",
            "FAILED tests/test_a.py::test_y - AssertionError: assert 1 == 2",
            "PASSED tests/test_a.py::test_z",
            "ERROR tests/test_a.py::test_z - RuntimeError: teardown",
            "XFAIL tests/test_a.py::test_known - reason",
            "ERROR tests/test_b.py",
            "========================= 1 failed, 3 passed in 0.01s ==========================",
        ]
    )
    assert parse_test_outcomes(output) == {
        "tests/test_a.py::test_x": "PASSED",
        "tests/test_a.py::test_p[a": "PASSED",  # the documented rule: the id ends at the first " - "
        "tests/test_a.py::test_y": "FAILED",
        "tests/test_a.py::test_z": "ERROR",
        "tests/test_a.py::test_known": "XFAIL",
        "tests/test_b.py": "ERROR",
    }
    assert parse_test_outcomes("PASSED a::b\n") == {}  # nothing before the banner counts


def test_grade():
    instance = swe.load_tasks("builtin:textkit__6")[0].instance
    (f2p,) = instance.FAIL_TO_PASS
    p2p = instance.PASS_TO_PASS
    all_pass = {t: "PASSED" for t in (f2p, *p2p)}
    assert grade(instance, all_pass)["resolved"] is True
    assert grade(instance, {**all_pass, p2p[0]: "XFAIL"})["resolved"] is True  # as SWE-bench counts it
    missing = dict(all_pass)
    del missing[p2p[3]]
    report = grade(instance, missing)
    assert report["resolved"] is False and report["tests"][p2p[3]] == "MISSING"
    assert report["tests_status"]["PASS_TO_PASS"]["failure"] == [p2p[3]]
    failing = grade(instance, {**all_pass, f2p: "FAILED"})
    assert failing["tests_status"]["FAIL_TO_PASS"] == {"success": [], "failure": [f2p]}


def test_revert_script_quotes_paths():
    script = revert_script("abc1234", ["tests/it's.py"])
    assert "git cat-file -e abc1234:'tests/it'\"'\"'s.py'" in script
    assert "rm -rf -- 'tests/it'\"'\"'s.py'" in script
