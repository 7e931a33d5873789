"""The ``llm_judge`` check: a WebVoyager-style verdict on the task, the agent's answer and the
last screenshots, from a multimodal model over any OpenAI-compatible endpoint.

Off unless configured: a task with an ``llm_judge`` check needs ``ORCHARD_JUDGE_MODEL``
(and optionally ``ORCHARD_JUDGE_BASE_URL``, ``ORCHARD_JUDGE_API_KEY``; they default to
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``). A judge that cannot be reached is an
infrastructure error (the episode is retried), never a reward of 0.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from orchard_async import VerifierError
from orchard_async.models.client import ChatClient, ModelConfig

SCREENSHOTS = 3  # the last distinct screenshots the judge sees

# After WebVoyager's auto_eval prompt (He et al., 2024).
SYSTEM_PROMPT = """\
As an evaluator, you will be presented with three primary components to assist you in your role:

1. Web Task Instruction: a clear and precise natural language directive that specifies an online \
activity to be executed.
2. Result Screenshots: a visual representation of the screen showing the result or intermediate \
state of performing the web task.
3. Result Response: a textual response obtained after the execution of the web task.

-- You DO NOT NEED to interact with web pages or perform actions such as booking flights or \
conducting searches on websites.
-- You SHOULD NOT make assumptions based on information not presented in the screenshots when \
comparing it to the instructions.
-- Your primary responsibility is to conduct a thorough assessment of the web task instruction \
against the outcome depicted in the screenshots and in the response, evaluating whether the \
actions taken align with the given instructions.
-- NOTE that the instruction may involve more than one task; failing to complete any of them \
means the task was not completed.
-- NOTE that the screenshots are authentic, but the response may contain errors: when the \
response contradicts the screenshots, trust the screenshots.

Give your reasoning, then end with either 'SUCCESS' or 'NOT SUCCESS'."""


def judge_messages(task: str, answer: str | None, screenshots: list[bytes]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": f"TASK: {task}\nResult Response: {answer or '(no answer)'}\n"
            f"{len(screenshots)} screenshots at the end:",
        }
    ]
    for png in screenshots:
        parts.append(
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
        )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]


def verdict(text: str) -> bool | None:
    """SUCCESS -> True, NOT SUCCESS -> False, neither -> None (the judge gave no verdict)."""
    if re.search(r"\bNOT\s+SUCCESS\b", text):
        return False
    if re.search(r"\bSUCCESS\b", text):
        return True
    return None


class Judge:
    def __init__(self, config: ModelConfig):
        self.client = ChatClient(config)

    async def __call__(self, task: str, answer: str | None, screenshots: list[bytes]) -> tuple[float, str]:
        completion = await self.client.complete(judge_messages(task, answer, screenshots))
        if completion.content is None:
            raise VerifierError(f"the judge's reply could not be read: {completion.error}")
        decided = verdict(completion.content)
        if decided is None:
            raise VerifierError(f"the judge gave no verdict: {completion.content[-300:]!r}")
        return float(decided), completion.content[-500:]

    async def close(self) -> None:
        await self.client.close()
