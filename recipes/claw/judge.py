"""The ``llm_judge`` check of Claw tasks: a model reads the user's request, the check's rubric,
the agent's final answer and what it did (its tool calls, from the verified audit) and says
PASS or FAIL.

Off unless configured, as in the GUI recipe: ``ORCHARD_JUDGE_MODEL`` (and optionally
``ORCHARD_JUDGE_BASE_URL``, ``ORCHARD_JUDGE_API_KEY``; they default to ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``). Without a judge an ``llm_judge`` check is left out of the completion
(``checks`` shows it as ``null``). A judge that cannot be reached, or answers without a
verdict, makes the episode a verifier error (an infrastructure failure): never a reward.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from orchard_async import InfraError, VerifierError
from orchard_async.models.client import ChatClient, ModelConfig, judge_config_if_set

AUDIT_CHARS = 12000  # of the tool calls shown to the judge (the latest kept)

SYSTEM_PROMPT = """\
You grade the work of a personal AI assistant that acted for a user through their services (mail, \
calendar, files and others). You get the user's request, a rubric, the assistant's final answer to \
the user and the tool calls it made (arguments and whether they succeeded). Judge only against the \
rubric, from what the calls and the answer show; do not assume anything they do not show.

Give your reasoning in a few sentences, then end with exactly one line: PASS or FAIL."""


def configured_judge(environ: Mapping[str, str] | None = None) -> ClawJudge | None:
    """The judge ``judge_config`` names (the model settings' one place); None when it names none."""
    config = judge_config_if_set(environ)
    return ClawJudge(config) if config is not None else None


def actions_text(audit: list[dict[str, Any]]) -> str:
    lines = [
        f"{entry.get('seq')}. {entry.get('tool')} {json.dumps(entry.get('args'), ensure_ascii=False)} -> "
        + ("ok" if entry.get("ok") else f"error {entry.get('status')}")
        for entry in audit
    ]
    return "\n".join(lines)[-AUDIT_CHARS:] or "(no tool calls)"


def judge_messages(prompt: str, rubric: str, answer: str, audit: list[dict[str, Any]]) -> list[dict[str, str]]:
    user = (
        f"USER REQUEST:\n{prompt.strip()}\n\nRUBRIC:\n{rubric.strip()}\n\n"
        f"FINAL ANSWER TO THE USER:\n{answer.strip() or '(none)'}\n\nTOOL CALLS:\n{actions_text(audit)}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def verdict(text: str) -> bool | None:
    """The last PASS or FAIL in the reply (None: the judge gave none)."""
    found = re.findall(r"\b(PASS|FAIL)\b", text)
    return None if not found else found[-1] == "PASS"


class ClawJudge:
    def __init__(self, config: ModelConfig):
        self.config = config

    async def __call__(self, prompt: str, rubric: str, answer: str, audit: list[dict[str, Any]]) -> tuple[bool, str]:
        client = ChatClient(self.config)
        try:
            completion = await client.complete(judge_messages(prompt, rubric, answer, audit))
        except InfraError as exc:
            raise VerifierError(f"the llm_judge model failed: {exc}") from exc
        except Exception as exc:  # the model's own error (a 4xx): no verdict either
            raise VerifierError(f"the llm_judge model failed: {type(exc).__name__}: {exc}") from exc
        finally:
            await client.close()
        if completion.content is None:
            raise VerifierError(f"the llm_judge reply could not be read: {completion.error}")
        decided = verdict(completion.content)
        if decided is None:
            raise VerifierError(f"the llm_judge gave no verdict: {completion.content[-300:]!r}")
        return decided, completion.content[-500:]
