"""A Claw-Eval task run as a Claw task: the same sandbox, services server and interfaces (CLI,
loopback HTTP, function tools, MCP), with Claw-Eval's tools and endpoints; its own submission
(after the agent: ``sandbox_grader_files`` copied in, ``env_snapshot_commands`` run, ``env_snapshot_files``
read) and grading (``claw_eval.grading``)."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard_async import Reward, Sandbox
from orchard_async.recipes.claw import services
from orchard_async.recipes.claw.claw_eval import grading
from orchard_async.recipes.claw.claw_eval.schema import TaskDefinition
from orchard_async.recipes.claw.task import FILE_LIMIT, ClawTask

INSTRUCTION = """\
{prompt}
{attachments}
Your tools ({services}), each a command on your PATH: `SERVICE TOOL --argument value` \
(`--json '{{...}}'` for all arguments at once); `claw tools` lists them with their arguments. Each \
also answers at its endpoint (POST the arguments as JSON; the ports are in /tmp/claw/ports.json when \
the declared one was taken):
{tool_lines}
A command that fails with a temporary error (exit status 75) can be tried again.{ask}
When you are done, give your final answer to the user with `claw answer "..."`, then submit."""


@dataclass(eq=False)
class ClawEvalTask(ClawTask):
    definition: TaskDefinition | None = None
    task_dir: Path = Path(".")
    sandbox_blobs: dict[str, bytes] = field(default_factory=dict)  # sandbox_files: in the workdir from the start
    grader_blobs: dict[str, bytes] = field(default_factory=dict)  # sandbox_grader_files: only after the agent
    local_grader_blobs: dict[str, bytes] = field(default_factory=dict)  # local_grader_files: the grader's eyes only
    # claw_eval was importable when the task was loaded: its grader.py grades (else the yaml's checks)
    claw_eval_grades: bool = False

    def instruction(self) -> str:
        lines = [
            f"- {t['service']} {t['tool_name']}  ({t['method']} {t['url']}): {t['description']}"
            for t in (self.claw_eval or {}).get("tools", [])
        ]
        attached = (
            f"\nAttached files (in your working directory): {', '.join(self.attachments)}\n" if self.attachments else ""
        )
        ask = ' You can ask the user a question with `ask "..."`.' if self.has_user else ""
        if self.has_user and self.definition is not None and self.definition.user_agent.system_prompt_suffix:
            ask += "\n" + self.definition.user_agent.system_prompt_suffix.strip()
        return INSTRUCTION.format(
            prompt=self.prompt.strip(),
            attachments=attached,
            services=", ".join(self.services),
            tool_lines="\n".join(lines),
            ask=ask,
        )

    async def setup(self, sandbox: Sandbox) -> str:
        text = await super().setup(sandbox)
        for path, data in self.sandbox_blobs.items():
            await sandbox.write_file(path, data)
        return text

    async def submission(self, sandbox: Sandbox) -> str:
        data = json.loads(await super().submission(sandbox))  # the services' audit is final from here on
        assert self.definition is not None
        for path, blob in self.grader_blobs.items():
            await sandbox.write_file(path, blob)
        snapshot: dict[str, Any] = {}
        timeout = float(self.definition.environment.env_snapshot_timeout)
        for command in self.definition.env_snapshot_commands:
            result = await sandbox.exec(command, timeout=timeout)
            services._check(result, f"env_snapshot_command {command!r}")
            snapshot[f"cmd:{command}"] = {
                "exit_code": result.exit_code,
                "stdout": result.text[-FILE_LIMIT:],
                "stderr": result.error_text[-FILE_LIMIT:],
                "timed_out": result.reason.value == "timeout",
            }
        for path in self.definition.env_snapshot_files:
            try:
                blob = await sandbox.read_file(path)
            except (FileNotFoundError, OSError) as exc:
                snapshot[f"file:{path}"] = {"error": str(exc) or "not found"}
                continue
            snapshot[f"file:{path}"] = {"content": blob[:FILE_LIMIT].decode("utf-8", "replace"), "encoding": "utf-8"}
        data["env_snapshot"] = snapshot
        return json.dumps(data)

    async def grade(self, submission: str, sandbox: Sandbox) -> Reward:
        start = time.monotonic()
        data = json.loads(submission)
        if data["problem"]:  # the services were stopped, replaced or their snapshot forged: nothing to credit
            return Reward(value=0.0, success=False, info={"task": self.id, "untrusted": data["problem"]})
        env_snapshot = dict(data.get("env_snapshot") or {})
        for name, blob in self.local_grader_blobs.items():
            env_snapshot[f"local_file:{name}"] = {"encoding": "base64", "content": base64.b64encode(blob).decode()}
        result = await grading.grade(self, data["audit"], data["world"], env_snapshot)
        result.update({"task": self.id, "score_s": round(time.monotonic() - start, 3), "audit": data["audit"]})
        if "user_calls" in data:
            result["simulated_user"] = {"model_calls": data["user_calls"]}
        return Reward(value=result["score"], success=result["passed"], info=result)
