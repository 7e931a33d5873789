"""Scripted policies for the SWE recipe: ``oracle`` and ``empty``.

Both speak the same bash-only protocol as a model would (their steps carry a canonical
reply), so their trajectories export to the same chat format.
"""

from __future__ import annotations

from orchard_async import Action, Observation


def _heredoc(text: str) -> tuple[str, str]:
    """A here-document delimiter that does not occur as a line of ``text``."""
    lines = set(text.splitlines())
    tag = "ORCHARD_PATCH"
    n = 0
    while tag in lines:
        n += 1
        tag = f"ORCHARD_PATCH_{n}"
    body = text if text.endswith("\n") else text + "\n"
    return tag, body


def gold_patch_command(patch: str, *, reverse: bool = False) -> str:
    """A shell command that applies ``patch`` (``reverse``: takes it back, as SWE-smith's
    fixes are its bug patches reversed) to the repository in the working directory."""
    tag, body = _heredoc(patch)
    flags = "-R " if reverse else ""
    return f"git apply {flags}--whitespace=nowarn <<'{tag}' && git status --short\n{body}{tag}"


class OraclePolicy:
    """Applies the instance's gold patch with shell commands, looks at the diff, submits."""

    name = "oracle"

    async def act(self, observation: Observation) -> Action:
        instance = getattr(observation.task, "instance", None)
        if instance is None:
            raise TypeError("the swe oracle needs SWE tasks (with an instance and its gold patch)")
        script = [
            (
                "I apply the reference fix for the issue.",
                gold_patch_command(instance.patch, reverse=getattr(instance, "gold_reverse", False)),
            ),
            ("I check what changed.", "git diff --stat"),
        ]
        if observation.step < len(script):
            thought, command = script[observation.step]
            return Action(command=command, raw=f"THOUGHT: {thought}\n\n```bash\n{command}\n```")
        return Action(kind="submit", command="submit", raw="THOUGHT: The fix is in place.\n\n```bash\nsubmit\n```")


class EmptyPolicy:
    """Submits at once, changing nothing: every instance must score 0."""

    name = "empty"

    async def act(self, observation: Observation) -> Action:
        return Action(kind="submit", command="submit", raw="THOUGHT: I submit without changes.\n\n```bash\nsubmit\n```")
