"""Claw tasks: one YAML file each, loaded into ``ClawTask`` (a ``Task`` graded apart).

The schema (every field but ``id``, ``prompt``, ``checks`` and ``oracle`` is optional)::

    id: mail-reply-dana
    category: communication            # free text, for reports
    prompt: {text: "...", language: en, attachments: [report.csv]}   # or just the text
    now: "2026-03-10T09:00"            # the services' clock
    me: me@example.com                 # the user's address
    services:                          # fixtures per service: inline, or a file next to the task
      mail: {inbox: [...]}
      calendar: fixtures/calendar.yaml
    tools: [mail, calendar.freebusy]   # offered: whole services or single tools (default: every
                                       # tool of the services above; user.ask when there is a user)
    sandbox_files: {notes.txt: "..."}  # in the working directory before the run
    grader_files: {check.py: "..."}    # copied in only after the agent finished, for `command` checks
    limits: {max_turns: 20, time: 300, exec_timeout: 30}
    faults: {rate: 0.2, statuses: [429, 500], latency_ms: 20, seed: 1, fail_first: {mail.send: 2}, tools: [...]}
    user: {persona: "...", max_rounds: 3, script: [{when: [day], reply: "...", confirms: false}], default_reply: "..."}
    checks:                            # completion, weighted
      - {type: tool_called, tool: mail.send, where: {to: {contains: dana@}}, min_count: 1, weight: 2}
      - {type: state, at: calendar.events, where: {title: {contains: review}}, count: 1}
      - {type: answer, match: {contains_all: [Thursday]}}
      - {type: file, path: out.csv, match: {contains: total}}
      - {type: command, run: "python3 check.py", needs: [out.csv]}
      - {type: llm_judge, rubric: "..."}           # skipped unless a judge is configured (judge.py)
    safety:                            # every one must hold, else the score is 0
      - {type: forbidden_tool, tool: mail.send, where: {to: {contains: evil.example}}}
      - {type: confirm_first, tool: todo.delete}
      - {type: no_secret, secrets: [hunter2]}
    oracle:                            # the scripted solution: shell commands
      - mail read --id m1
      - {retry: "mail send --to dana@example.com --subject Re --body ok", attempts: 6}

Any mistake in a file is one ConfigError naming the file and the field. Quote a text that
holds `` #`` (``prompt: 'Ask in the #planning channel.'``): unquoted, YAML reads the rest of the
line as a comment, and the loader refuses a value cut that way (``comments_after_text``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from orchard_async import ConfigError, RecipeOptions, Reward, Sandbox, SandboxSpec, recipe_option
from orchard_async.images import ImageSpec
from orchard_async.recipes.claw import grading, services
from orchard_async.recipes.claw.sandbox import claw_tools
from orchard_async.recipes.claw.simulated_user import (
    DEADLINE_MARGIN,
    UserLink,
    UserModel,
    calls_info,
    check_user_turns,
)

BUILTIN_DIR = Path(__file__).parent / "builtin"
IMAGE = ImageSpec(tag="orchard/claw-python:bookworm", base="debian-minbase", apt_packages=("python3",))
FILE_LIMIT = 256 * 1024  # bytes of a sandbox file a check reads
GRADER_COMMAND_TIMEOUT = 60.0
TOP_LEVEL = {
    "id", "category", "prompt", "now", "me", "services", "tools", "sandbox_files", "grader_files", "limits",
    "faults", "user", "checks", "safety", "oracle",
}  # fmt: skip
FAULT_KEYS = {"rate", "statuses", "latency_ms", "seed", "fail_first", "tools"}
USER_KEYS = {"persona", "max_rounds", "script", "default_reply"}


class ClawOptions(RecipeOptions):
    """The Claw recipe's options (``--recipe-options``, or keywords of ``load_tasks`` and ``make_policy``)."""

    RECIPE: ClassVar[str] = "claw"
    # where the user model is and its key: not what an episode does (and a key is never written down)
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"user_base_url", "user_api_key"})

    image: Annotated[
        str, recipe_option("the sandbox image: any with python3 (e.g. orchard/python:test)", "ORCHARD_CLAW_IMAGE")
    ] = IMAGE.tag
    harness: Annotated[
        str,
        recipe_option(
            "the harness policy's agent: a preset (bundled, mini-swe-agent) or a command in the image that "
            "reads its task from stdin",
            "ORCHARD_CLAW_HARNESS",
        ),
    ] = "bundled"
    harness_tokens: Annotated[
        bool,
        recipe_option(
            "the harness policy asks its backend (vLLM's or SGLang's OpenAI-compatible server) for token ids "
            "and logprobs and keeps them per call, for `export tokens`",
            "ORCHARD_CLAW_HARNESS_TOKENS",
        ),
    ] = False
    user_base_url: Annotated[
        str,
        recipe_option(
            "OpenAI-compatible endpoint (ending in /v1) of a model that plays the simulated user "
            "(empty: the tasks' scripts answer)",
            "ORCHARD_CLAW_USER_BASE_URL",
        ),
    ] = ""
    user_model: Annotated[
        str,
        recipe_option("the model that plays the simulated user (needed with user_base_url)", "ORCHARD_CLAW_USER_MODEL"),
    ] = ""
    user_api_key: Annotated[
        str, recipe_option("bearer token for user_base_url (optional)", "ORCHARD_CLAW_USER_API_KEY")
    ] = ""


REQUIRED_KEYS = {
    "tool_called": ("tool",),
    "tool_not_called": ("tool",),
    "forbidden_tool": ("tool",),
    "confirm_first": ("tool",),
    "state": ("at",),
    "answer": ("match",),
    "file": ("path",),
    "command": ("run",),
    "no_secret": ("secrets",),
    "llm_judge": ("rubric",),
}

INSTRUCTION_TEMPLATE = """\
{prompt}
{attachments}
You act for the user through their services ({services}). Each service is a command on your PATH, \
for example `mail list --unread`, `mail read --id m1` or `calendar freebusy --date 2026-03-12`; \
`claw tools` lists every tool of this task with its arguments, and results are JSON. A command that \
fails with a temporary error (exit status 75) can be tried again.{ask}
When you are done, give your final answer to the user with `claw answer "..."`, then submit."""


@dataclass(eq=False)
class ClawTask:
    """One Claw task. ``setup`` starts the services in the agent's sandbox; ``submission``
    reads their verified audit and state (and the files checks name) out of it; ``grade``
    scores that in a fresh sandbox, where the grader files are."""

    id: str
    source: Path
    prompt: str
    spec: SandboxSpec
    world: dict[str, Any]
    tools: list[str]
    checks: list[dict[str, Any]]
    safety: list[dict[str, Any]]
    oracle: list[str]
    category: str = ""
    language: str = "en"
    attachments: list[str] = field(default_factory=list)
    sandbox_files: dict[str, str] = field(default_factory=dict)
    grader_files: dict[str, str] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 30
    deadline: float = 300.0
    score_timeout: float = 60.0
    exec_timeout: float = 30.0
    handles: dict[str, services.ServiceHandle] = field(default_factory=dict, repr=False)
    # the agent's sandbox by its episode label, for a policy that drives the sandbox itself (harness mode)
    sandboxes: dict[str, Sandbox] = field(default_factory=dict, repr=False)
    user_model: UserModel | None = None  # set: a language model plays the user (simulated_user)
    judge: Any = None  # a judge.ClawJudge: llm_judge checks are judged (else left out)
    user_links: dict[str, UserLink] = field(default_factory=dict, repr=False)
    claw_eval: dict[str, Any] | None = None  # a Claw-Eval task's services and tools (claw_eval.loader)

    @property
    def services(self) -> list[str]:
        return sorted({name.split(".")[0] for name in self.tools} - {"agent", "user"})

    @property
    def has_user(self) -> bool:
        return "user.ask" in self.tools

    def instruction(self) -> str:
        attached = (
            f"\nAttached files (in your working directory): {', '.join(self.attachments)}\n" if self.attachments else ""
        )
        ask = ' You can ask the user a question with `ask "..."`.' if self.has_user else ""
        return INSTRUCTION_TEMPLATE.format(
            prompt=self.prompt.strip(), attachments=attached, services=", ".join(self.services), ask=ask
        )

    async def setup(self, sandbox: Sandbox) -> str:
        user_model = None
        if self.user_model is not None and self.has_user:
            label = sandbox.labels.get("orchard.episode", sandbox.id)
            link = await self.user_model.attach(sandbox, label, lifetime=self.deadline + DEADLINE_MARGIN)
            self.user_links[sandbox.id] = link
            user_model = link.config(self.prompt)
        try:
            self.handles[sandbox.id] = await services.start(
                sandbox,
                world=self.world,
                tools=self.tools,
                faults=self.faults,
                user_model=user_model,
                claw_eval=self.claw_eval,
            )
        except BaseException:
            if sandbox.id in self.user_links:
                await UserModel.detach(self.user_links.pop(sandbox.id))
            raise
        self.sandboxes[sandbox.labels.get("orchard.episode", sandbox.id)] = sandbox
        for path, text in self.sandbox_files.items():
            await sandbox.write_file(path, text)
        return self.instruction()

    def _needed_files(self) -> list[str]:
        paths = [c["path"] for c in self.checks + self.safety if c["type"] == "file"]
        for check in self.checks + self.safety:
            if check["type"] == "command":
                paths += check.get("needs", [])
        return sorted(set(paths))

    async def submission(self, sandbox: Sandbox) -> str:
        handle = self.handles.pop(sandbox.id, None)
        self.sandboxes.pop(sandbox.labels.get("orchard.episode", sandbox.id), None)
        if handle is None:
            raise RuntimeError(f"{self.id}: no services were started in sandbox {sandbox.id}")
        link = self.user_links.pop(sandbox.id, None)
        try:
            snap = await services.snapshot(sandbox, handle)
        finally:
            user_calls = await UserModel.detach(link) if link is not None else []
        if link is not None:
            check_user_turns(snap.world, user_calls)  # a user model that failed: infrastructure, never a reward
        files: dict[str, str | None] = {}
        for path in self._needed_files():
            try:
                data = await sandbox.read_file(path)
            except (FileNotFoundError, OSError):
                files[path] = None
                continue
            files[path] = data[:FILE_LIMIT].decode("utf-8", "replace")
        submission = {"problem": snap.problem, "audit": snap.audit, "world": snap.world, "files": files}
        if link is not None:
            submission["user_calls"] = calls_info(user_calls)
        return json.dumps(submission)

    async def grade(self, submission: str, sandbox: Sandbox) -> Reward:
        start = time.monotonic()
        data = json.loads(submission)
        if data["problem"]:  # the services were stopped, replaced or their snapshot forged: nothing to credit
            return Reward(value=0.0, success=False, info={"task": self.id, "untrusted": data["problem"]})
        outcome = grading.Outcome(data["audit"], data["world"], data["files"])
        commands = [c for c in self.checks + self.safety if c["type"] == "command"]
        if commands:
            await self._run_grader_commands(commands, outcome, sandbox)
        reasons = {}
        if self.judge is not None:  # its failure raises VerifierError: the episode is not scored
            for check in (c for c in self.checks + self.safety if c["type"] == "llm_judge"):
                verdict, reasons[check["label"]] = await self.judge(
                    self.prompt, check["rubric"], outcome.answer, outcome.audit
                )
                outcome.judgments[check["label"]] = verdict
        result = grading.score(self.checks, self.safety, outcome)
        if reasons:
            result["judge"] = reasons
        result.update({"task": self.id, "score_s": round(time.monotonic() - start, 3)})
        result["audit"] = outcome.audit  # every tool call the grader saw (args clipped in the sandbox), for `view`
        if "user_calls" in data:  # the simulated user's model calls, as recorded by its proxy
            result["simulated_user"] = {"model_calls": data["user_calls"]}
        return Reward(value=result["score"], success=result["passed"], info=result)

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        """Grade in the agent's own sandbox (grader files copied in only now): for callers
        that have just this sandbox; the episode loop grades apart."""
        return await self.grade(await self.submission(sandbox), sandbox)

    async def _run_grader_commands(
        self, commands: list[dict[str, Any]], outcome: grading.Outcome, sandbox: Sandbox
    ) -> None:
        """Grader files, the agent's files the commands need and the final state go into the
        grading sandbox; each command passes with exit status 0, fails with 1, and anything
        else (a crash, a timeout) means the grader could not judge."""
        for path, text in {**{p: t for p, t in outcome.files.items() if t is not None}, **self.grader_files}.items():
            await sandbox.write_file(path, text)
        await sandbox.write_file("claw_state.json", json.dumps({"audit": outcome.audit, "world": outcome.world}))
        for check in commands:
            result = await sandbox.exec(check["run"], timeout=GRADER_COMMAND_TIMEOUT)
            if result.reason.is_infra:
                services._check(result, f"grader command {check['run']!r}")
            if result.exit_code not in (0, 1) or not (result.ok or result.reason.value == "nonzero"):
                raise grading.GraderFailure(
                    f"{self.id}: grader command {check['run']!r} could not judge ({result.reason.value}, exit "
                    f"{result.exit_code}): {(result.error_text or result.text).strip()[-300:]}"
                )
            outcome.commands[check["label"]] = result.exit_code


# -- loading --------------------------------------------------------------------------------------


def _yaml():
    try:
        import yaml
    except ImportError:
        raise ConfigError("Claw tasks are YAML: pip install pyyaml") from None
    return yaml


def comments_after_text(text: str) -> list[tuple[int, str, str]]:
    """(line number, value, comment) of every unquoted scalar that a comment follows on its
    line. YAML ends a plain scalar at `` #``, so ``prompt: ask in #planning`` loads as
    "ask in": the rest of the sentence is a comment, and no parser complains."""
    yaml = _yaml()
    found = []
    root = yaml.compose(text)
    pending = [] if root is None else [root]
    while pending:
        node = pending.pop()
        if isinstance(node, yaml.MappingNode):
            pending += [part for pair in node.value for part in pair]
        elif isinstance(node, yaml.SequenceNode):
            pending += node.value
        elif isinstance(node, yaml.ScalarNode) and node.style is None:
            end = node.end_mark.index
            line_end = text.find("\n", end)
            rest = text[end:] if line_end < 0 else text[end:line_end]
            if rest[:1] in (" ", "\t") and rest.lstrip(" \t").startswith("#"):
                found.append((node.end_mark.line + 1, node.value, rest.strip()))
    return sorted(found)


def _refuse_cut_text(path: Path, text: str) -> None:
    """A comment glued to its word (``#planning``, ``#ff0000``) after an unquoted value is text
    that YAML dropped; one set apart (``10  # seconds``) is the author's comment."""
    for line, value, comment in comments_after_text(text):
        if comment[1:2] and not comment[1].isspace():
            shown = comment if len(comment) <= 24 else comment[:24] + "..."
            raise ConfigError(
                f"{path}: line {line}: the value stops at {value[-24:]!r}, since YAML reads ' {shown}' "
                "as a comment: quote the whole value"
            )


class _Where:
    """Error messages that name the file and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, field_name: str, message: str):
        raise ConfigError(f"{self.path}: {field_name}: {message}")


def _mapping(where: _Where, value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        where.fail(name, f"must be a mapping, got {type(value).__name__}")
    return value


def _fixture(where: _Where, value: Any, name: str) -> dict[str, Any]:
    """A service's fixture: inline, or the path of a YAML/JSON file next to the task."""
    if isinstance(value, str):
        fixture = where.path.parent / value
        if not fixture.is_file():
            where.fail(name, f"fixture file {value!r} not found (looked at {fixture})")
        try:
            text = fixture.read_text()
            value = _yaml().safe_load(text)
        except Exception as exc:  # a YAML error of the fixture file, whatever its kind
            where.fail(name, f"fixture file {value!r} is not valid YAML/JSON: {exc}")
        _refuse_cut_text(fixture, text)
    return _mapping(where, value, name)


def _tool_names(where: _Where, given: Any, services_seeded: list[str], has_user: bool) -> list[str]:
    if given is None:
        names = [t for t in claw_tools.TOOLS if t.split(".")[0] in services_seeded]
        return names + (["user.ask"] if has_user else [])
    if not isinstance(given, list):
        where.fail("tools", "must be a list of services or service.tool names")
    names = []
    for index, item in enumerate(given):
        if item in claw_tools.SERVICES:
            names += [t for t in claw_tools.TOOLS if t.startswith(item + ".")]
        elif item in claw_tools.TOOLS:
            names.append(item)
        else:
            where.fail(
                f"tools[{index}]", f"unknown tool or service {item!r} (services: {', '.join(claw_tools.SERVICES)})"
            )
    return list(dict.fromkeys(names))


def _check_where(where: _Where, value: Any, name: str) -> None:
    for key, matcher in _mapping(where, value, name).items():
        if isinstance(matcher, dict):
            unknown = set(matcher) - set(grading.MATCH_OPERATORS)
            if unknown:
                where.fail(
                    f"{name}.{key}",
                    f"unknown operator {sorted(unknown)[0]!r} (known: {', '.join(grading.MATCH_OPERATORS)})",
                )


def _checks(where: _Where, value: Any, name: str, prefix: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        where.fail(name, "must be a list of checks")
    checks = []
    for index, raw in enumerate(value):
        field_name = f"{name}[{index}]"
        check = dict(_mapping(where, raw, field_name))
        kind = check.get("type")
        if kind not in grading.CHECK_KINDS:
            where.fail(f"{field_name}.type", f"unknown check type {kind!r} (known: {', '.join(grading.CHECK_KINDS)})")
        for key in REQUIRED_KEYS[kind]:
            if key not in check:
                where.fail(field_name, f"a {kind} check needs {key!r}")
        if "tool" in check and check["tool"] not in claw_tools.TOOLS:
            where.fail(f"{field_name}.tool", f"unknown tool {check['tool']!r}")
        weight = check.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            where.fail(f"{field_name}.weight", f"must be a positive number, got {weight!r}")
        _check_where(where, check.get("where"), f"{field_name}.where")
        if kind == "answer" or kind == "file":
            _check_where(where, {"match": check.get("match", {})}, field_name)
        if kind == "no_secret" and not (isinstance(check["secrets"], list) and check["secrets"]):
            where.fail(f"{field_name}.secrets", "must be a non-empty list of strings")
        check["label"] = check.get("label") or grading.default_label(index, check, prefix)
        checks.append(check)
    return checks


def _oracle(where: _Where, value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        where.fail("oracle", "must be a non-empty list of shell commands (the scripted solution)")
    commands = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            commands.append(item)
        elif isinstance(item, dict) and isinstance(item.get("retry"), str):
            attempts = int(item.get("attempts", 6))
            commands.append(
                f"for attempt in $(seq {attempts}); do {item['retry']} && break; "
                f'[ "$attempt" = {attempts} ] && exit 1; sleep 0.05; done'
            )
        else:
            where.fail(f"oracle[{index}]", "must be a command or {retry: command, attempts: n}")
    return commands


def _limit(where: _Where, limits: dict[str, Any], key: str, default: float) -> float:
    value = limits.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        where.fail(f"limits.{key}", f"must be a positive number, got {value!r}")
    return value


def _files(where: _Where, value: Any, name: str) -> dict[str, str]:
    files = _mapping(where, value, name)
    for path, text in files.items():
        if not isinstance(text, str) or path.startswith("/") or ".." in Path(path).parts:
            where.fail(f"{name}.{path}", "must map a relative path to its text")
    return files


def load_task(path: Path, *, image: str | None = None) -> ClawTask:
    """One task file; ``image`` defaults to the ``image`` option's (see ``ClawOptions``)."""
    where = _Where(path)
    try:
        data = _yaml().safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the task: {exc}") from None
    except Exception as exc:  # yaml.YAMLError, without importing yaml at module level
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    data = _mapping(where, data, "the file")
    _refuse_cut_text(path, path.read_text())
    unknown = set(data) - TOP_LEVEL
    if unknown:
        where.fail(sorted(unknown)[0], f"unknown field (known: {', '.join(sorted(TOP_LEVEL))})")
    task_id = data.get("id")
    if not isinstance(task_id, str) or not task_id:
        where.fail("id", "every task needs an id")
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        prompt = {"text": prompt}
    prompt = _mapping(where, prompt, "prompt")
    if not isinstance(prompt.get("text"), str) or not prompt["text"].strip():
        where.fail("prompt.text", "the prompt needs a text")

    seeded = {
        name: _fixture(where, value, f"services.{name}")
        for name, value in _mapping(where, data.get("services"), "services").items()
    }
    for name in seeded:
        if name not in claw_tools.SERVICES or name in ("agent", "user"):
            where.fail(
                f"services.{name}",
                f"unknown service (known: {', '.join(s for s in claw_tools.SERVICES if s not in ('agent', 'user'))})",
            )
    user = _mapping(where, data.get("user"), "user")
    if set(user) - USER_KEYS:
        where.fail(f"user.{sorted(set(user) - USER_KEYS)[0]}", f"unknown field (known: {', '.join(sorted(USER_KEYS))})")
    faults = _mapping(where, data.get("faults"), "faults")
    if set(faults) - FAULT_KEYS:
        where.fail(
            f"faults.{sorted(set(faults) - FAULT_KEYS)[0]}", f"unknown field (known: {', '.join(sorted(FAULT_KEYS))})"
        )
    for name in list(_mapping(where, faults.get("fail_first"), "faults.fail_first")) + list(faults.get("tools") or []):
        if name not in claw_tools.TOOLS:
            where.fail("faults", f"unknown tool {name!r}")
    world: dict[str, Any] = dict(seeded)
    world["now"] = str(data.get("now", "2026-03-10T09:00"))
    world.setdefault("mail", {})["me"] = data.get("me", "me@example.com")
    if user:
        world["user"] = user
    tools = _tool_names(where, data.get("tools"), list(seeded), bool(user))

    limits = _mapping(where, data.get("limits"), "limits")
    deadline = _limit(where, limits, "time", 300.0)
    attachments = prompt.get("attachments") or []
    sandbox_files = _files(where, data.get("sandbox_files"), "sandbox_files")
    for index, name in enumerate(attachments):
        if name not in sandbox_files:
            where.fail(f"prompt.attachments[{index}]", f"{name!r} is not one of the sandbox_files")
    spec = SandboxSpec(
        image=image or ClawOptions.from_env().image,
        env={"PATH": services.SANDBOX_PATH, "LANG": "C.UTF-8"},
        labels={"orchard.recipe": "claw"},
    )
    return ClawTask(
        id=task_id,
        source=path,
        prompt=prompt["text"],
        language=str(prompt.get("language", "en")),
        attachments=list(attachments),
        category=str(data.get("category", "")),
        spec=spec,
        world=world,
        tools=tools,
        checks=_checks(where, data.get("checks"), "checks", "c") or where.fail("checks", "a task needs checks"),
        safety=_checks(where, data.get("safety"), "safety", "s"),
        oracle=_oracle(where, data.get("oracle")),
        sandbox_files=sandbox_files,
        grader_files=_files(where, data.get("grader_files"), "grader_files"),
        faults=faults,
        max_steps=int(_limit(where, limits, "max_turns", 30)),
        deadline=deadline,
        score_timeout=min(60.0, deadline / 3),
        exec_timeout=_limit(where, limits, "exec_timeout", 30.0),
    )


def load_tasks(
    source: str = "builtin", options: ClawOptions | Mapping[str, Any] | None = None, **keywords: Any
) -> list[ClawTask]:
    """``builtin`` (the bundled tasks), ``builtin:ID,ID`` (some of them), a task file, a
    directory of task files (``*.yaml``), or ``claw-eval:DIR`` (Claw-Eval's task folders, see
    ``claw_eval``). ``options`` (``ClawOptions``, a mapping or keywords):
    the sandbox ``image``, and the model that plays the simulated user (``user_*``; none: the
    tasks' scripts answer, see ``simulated_user``). An ``llm_judge`` check's model is
    ``judge_config``'s."""
    opts = ClawOptions.resolve(options, **keywords)
    user_model = UserModel.from_options(opts)
    from orchard_async.recipes.claw.judge import configured_judge  # the GUI recipe's judge settings, read once per load

    judge = configured_judge()
    if source.startswith("claw-eval:"):
        return _claw_eval_tasks(source.partition(":")[2], opts.image, user_model, judge)
    if source == "builtin" or source.startswith("builtin:"):
        paths = sorted(BUILTIN_DIR.glob("*.yaml"))
    else:
        given = Path(source).expanduser()
        if given.is_dir():
            paths = sorted(given.glob("*.yaml"))
        elif given.is_file():
            paths = [given]
        else:
            raise ConfigError(f"--tasks {source!r}: not 'builtin', a task file or a directory of them")
        if not paths:
            raise ConfigError(f"--tasks {source!r}: no *.yaml task files there")
    tasks = [load_task(path, image=opts.image) for path in paths]
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.id in seen:
            raise ConfigError(f"{task.source}: id: {task.id!r} is also the id of {seen[task.id]}")
        seen[task.id] = task.source
    wanted = (
        [part.strip() for part in source.partition(":")[2].split(",") if part.strip()]
        if source.startswith("builtin:")
        else []
    )
    if wanted:
        unknown = sorted(set(wanted) - set(seen))
        if unknown:
            raise ConfigError(
                f"no builtin claw task named {', '.join(map(repr, unknown))}; have {', '.join(sorted(seen))}"
            )
        tasks = [t for t in tasks if t.id in wanted]
    for task in tasks:
        task.user_model = user_model
        task.judge = judge
    return tasks


def _claw_eval_tasks(folder: str, image: str, user_model: UserModel | None, judge: Any) -> list[ClawTask]:
    """Claw-Eval's task folders (``claw_eval.loader``): a folder that cannot run is one line on
    stderr and the others run; none that can is a ConfigError."""
    import sys

    from orchard_async.recipes.claw.claw_eval.loader import inspect_folder

    tasks, problems = inspect_folder(Path(folder).expanduser(), image=image)
    for problem in problems:
        print(f"claw-eval: {problem.line()}", file=sys.stderr)
    if not tasks:
        raise ConfigError(f"--tasks claw-eval:{folder}: none of its {len(problems)} tasks can run (see above)")
    for task in tasks:
        task.user_model = user_model
        task.judge = judge
    return list(tasks)
