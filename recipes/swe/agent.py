"""The bash-only agent harness, in the spirit of mini-swe-agent.

The model sees a system prompt and the instance prompt (the task's instruction), then
works in turns: each reply holds a short THOUGHT and exactly one ```bash block with one
command; the command runs in a fresh shell in the repository root; its exit code and
output (head and tail kept when long) come back as the next user message. A reply with
no block, or several, is a *format error*: it is recorded as an ``invalid`` step, the
model is told what was wrong, and the episode goes on. Running ``submit`` ends the
episode; the working tree's diff is the patch.

The conversation is rebuilt from the episode's steps on every turn, by the same function
that exports trajectories for SFT, so training data is exactly what the model saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from orchard_async import Action, Step

SUBMIT_COMMANDS = ("submit", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
OBSERVATION_CHARS = 10_000  # characters of command output shown to the model per turn

SYSTEM_PROMPT = """\
You are a software engineer who fixes issues in code repositories by running shell commands.

Every reply has two parts: a short THOUGHT explaining your reasoning, then exactly ONE \
bash code block holding exactly one command (chain steps with && or || if needed). \
Replies with no bash block, or with more than one, are rejected.

Each command runs in a fresh non-interactive shell started in the repository root: \
`cd` and environment variables do not carry over to the next command, and interactive \
programs (editors, pagers, prompts) will hang. Edit files with sed, python3 or cat with a heredoc.\
"""

INSTANCE_TEMPLATE = """\
<issue>
{problem_statement}
</issue>

The repository {repo} is checked out in the current directory ({workdir}) at commit \
{short_commit}. Change its non-test source files so that the issue above is resolved. \
Do not change the tests or the project configuration: hidden tests will check your fix.

A good way to work:
1. Find and read the code involved.
2. Reproduce the problem with a small script.
3. Edit the source to fix it, keeping the change minimal.
4. Run your script again and the existing tests to confirm the fix.
5. Submit.

Rules:
- One command per reply, in a single ```bash block, after your THOUGHT.
- Long outputs are cut in the middle; narrow them with grep, head, tail or sed -n.
- Commands time out after {exec_timeout:g} seconds; you have at most {max_steps} replies.
- When you are done, reply with the command `submit` on its own; your patch is the \
diff of the working tree (you do not need to commit). You cannot continue after submitting.

Example reply:
THOUGHT: I need to see how the parser handles operators first.

```bash
grep -n "precedence" -r src | head -20
```
"""

FORMAT_ERROR_TEMPLATE = """\
Format error: {error}

Reply with a THOUGHT and then exactly ONE ```bash block holding one command. \
To finish, reply with the command `submit` in that block.\
"""

OBSERVATION_TEMPLATE = """\
<returncode>{exit_code}</returncode>
<output>
{output}</output>\
"""

_BLOCK = re.compile(r"```(?:bash|sh)[ \t]*\r?\n(.*?)```", re.DOTALL)


def parse_reply(text: str) -> Action:
    """A model reply -> one shell command, ``submit``, or a format error (``invalid``)."""
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        found = "no ```bash block" if not blocks else f"{len(blocks)} ```bash blocks"
        return Action(kind="invalid", raw=text, error=f"expected exactly one ```bash block, found {found}")
    command = blocks[0].strip()
    if not command:
        return Action(kind="invalid", raw=text, error="the ```bash block is empty")
    if command in SUBMIT_COMMANDS or command.startswith(SUBMIT_COMMANDS[1]):
        return Action(kind="submit", command=command, raw=text)
    return Action(kind="exec", command=command, raw=text)


def truncate_middle(text: str, limit: int = OBSERVATION_CHARS) -> str:
    """Keep the head and the tail of long text, saying how much was left out."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    elided = len(text) - head - tail
    return f"{text[:head]}\n[... {elided} characters elided; narrow the output with grep/head/tail ...]\n{text[-tail:]}"


def render_reply(action: Action) -> str:
    """The assistant message of a step: the model's own text, or a canonical reply for
    scripted policies (oracle, empty) that have none."""
    if action.raw:
        return action.raw
    if action.kind == "submit":
        return "THOUGHT: The change is complete, so I submit it.\n\n```bash\nsubmit\n```"
    return f"THOUGHT: Next step.\n\n```bash\n{action.command}\n```"


def render_observation(step: Step, limit: int = OBSERVATION_CHARS) -> str:
    """The user message answering a step: its output, or the format error."""
    if step.action.kind == "invalid":
        return FORMAT_ERROR_TEMPLATE.format(error=step.action.error or "unreadable reply")
    output = step.observation
    if step.reason == "timeout":
        output += "\n[the command timed out and was killed; try something faster]"
    output = truncate_middle(output, limit)
    if output and not output.endswith("\n"):
        output += "\n"
    exit_code = step.exit_code if step.exit_code is not None else -1
    return OBSERVATION_TEMPLATE.format(exit_code=exit_code, output=output)


def build_messages(
    instruction: str,
    steps: Iterable[Step],
    *,
    system_prompt: str = SYSTEM_PROMPT,
    observation_chars: int = OBSERVATION_CHARS,
) -> list[dict[str, Any]]:
    """The chat so far: system, instance prompt, then one assistant/user pair per step.

    A step whose reply could not be read at all (an empty malformed response) is left out,
    so the model is never shown an empty assistant turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": instruction},
    ]
    for step in steps:
        if step.action.kind == "invalid" and not step.action.raw:
            continue
        messages.append({"role": "assistant", "content": render_reply(step.action)})
        if step.action.kind != "submit":
            messages.append({"role": "user", "content": render_observation(step, observation_chars)})
    return messages


def tokens_spent(steps: Sequence[Step]) -> int:
    return sum(step.action.usage.get("total_tokens", 0) for step in steps)
