"""Claw-Eval task folders (``<task_id>/task.yaml`` with ``grader.py`` and ``fixtures/``), loaded
unchanged into Claw tasks.

``inspect_folder(DIR)`` reads every task under DIR (a folder of task folders, as Claw-Eval's
``tasks/``, or one task folder) and sorts them into tasks that run and problems, one line each
(``T01_gmail_digest: cannot run: service 'web_real' is not one we have ...``): a bad folder never
stops the others. What makes a task unrunnable: YAML that does not parse or does not fit Claw-Eval's
schema (``schema``), a service we do not serve (``sandbox/claw_eval_services.SERVICES``), a tool with
no endpoint or an endpoint no declared service answers, a file the task names that is not there.

Paths the task names (a service's fixture in ``env``, ``sandbox_files``, ``sandbox_grader_files``,
``local_grader_files``, ``environment.fixtures``) resolve against the task's folder first, then
the repository root (the folder above ``tasks/``: Claw-Eval writes ``tasks/<id>/fixtures/...``).

Claw-Eval's reference solution is prose; the recipe's ``oracle`` policy runs ``oracle.sh`` next
to ``task.yaml`` when there is one (one shell command a line), else it does nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from orchard_async import ConfigError, SandboxSpec
from orchard_async.recipes.claw import services
from orchard_async.recipes.claw.claw_eval.grading import claw_eval_importable
from orchard_async.recipes.claw.claw_eval.schema import TaskDefinition, parse
from orchard_async.recipes.claw.sandbox import claw_eval_services

DATA_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml")
FIXTURE_SUFFIXES = (*DATA_SUFFIXES, ".csv", ".txt", ".md")
TEXT_LIMIT = 4 * 1024 * 1024  # bytes of one file a task names
DEFAULT_USER_REPLY = "I have told you what I need; please go ahead as you see fit."


class TaskProblem(Exception):
    """Why one task folder cannot run (its line in the report)."""


@dataclass
class Problem:
    path: Path
    name: str
    reason: str

    def line(self) -> str:
        return f"{self.name}: cannot run: {self.reason} ({self.path})"


def task_files(source: Path) -> list[Path]:
    """``source``'s task.yaml files: its own, or its subfolders' (sorted)."""
    if (source / "task.yaml").is_file():
        return [source / "task.yaml"]
    return sorted(source.glob("*/task.yaml"))


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError("Claw-Eval tasks are YAML: pip install pyyaml") from None
    return yaml


def read_definition(path: Path) -> TaskDefinition:
    try:
        data = _yaml().safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TaskProblem(f"cannot read task.yaml: {exc.strerror or exc}") from None
    except Exception as exc:  # yaml.YAMLError, whatever its kind: one line
        raise TaskProblem(f"task.yaml is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise TaskProblem(f"task.yaml must be a mapping, got {type(data).__name__}")
    try:
        return parse(data)
    except msgspec.ValidationError as exc:
        raise TaskProblem(f"does not fit Claw-Eval's task schema: {exc}") from None


def resolve(task_dir: Path, name: str) -> Path:
    """A path a task names: in its folder, else under the repository root."""
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise TaskProblem(f"file {name!r} must be a relative path inside the task or repository")
    roots = [task_dir, task_dir.parent.parent, task_dir.parent]
    for root in roots:
        if (root / relative).is_file():
            return root / relative
    raise TaskProblem(
        f"file {name!r} not found (looked in {task_dir} and the repository root {task_dir.parent.parent})"
    )


def _read_data(path: Path) -> Any:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            return json.loads(text)
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return _yaml().safe_load(text)
    except Exception as exc:  # JSON or YAML error of a fixture: the task's problem, one line
        raise TaskProblem(f"fixture {path.name!r} is not valid {path.suffix[1:].upper()}: {exc}") from None


def _is_fixture(key: str, value: str) -> bool:
    return "FIXTURE" in key.upper() or value.lower().endswith(FIXTURE_SUFFIXES)


def _service_fixtures(task_dir: Path, env: dict[str, str]) -> list[Any]:
    fixtures = []
    for key, value in env.items():
        if not _is_fixture(key, value):
            continue
        found = resolve(task_dir, value)
        if found.suffix in DATA_SUFFIXES:
            fixtures.append(_read_data(found))
    return fixtures


def _endpoint_parts(url: str) -> tuple[int | None, str]:
    parts = urlsplit(url)
    try:
        return parts.port, parts.path or "/"
    except ValueError:
        raise TaskProblem(f"endpoint {url!r} has no valid port") from None


def claw_eval_config(definition: TaskDefinition, task_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the services' config for the sandbox, the seeded ``claw_eval`` world)."""
    have = claw_eval_services.SERVICES
    by_port: dict[int, str] = {}
    declared = []
    fixtures = []
    for service in definition.services:
        if service.name not in have:
            raise TaskProblem(f"service {service.name!r} is not one we have (have: {', '.join(have)})")
        _, health = _endpoint_parts(service.health_check)
        reset = _endpoint_parts(service.reset_endpoint)[1] if service.reset_endpoint else None
        by_port[service.port] = service.name
        declared.append(
            {
                "name": service.name,
                "port": service.port,
                "health": health,
                "health_method": service.health_check_method.upper(),
                "reset": reset,
            }
        )
        fixtures.append(
            {
                "name": service.name,
                "fixtures": _service_fixtures(task_dir, {key: str(value) for key, value in service.env.items()}),
            }
        )
    endpoints = {endpoint.tool_name: endpoint for endpoint in definition.tool_endpoints}
    names = {s["name"] for s in declared}
    tools = []
    for spec in definition.tools:
        endpoint = endpoints.get(spec.name)
        if endpoint is None:
            raise TaskProblem(
                f"tool {spec.name!r} has no tool_endpoint (tools without one, such as Bash, are not served)"
            )
        port, path = _endpoint_parts(endpoint.url)
        first = path.strip("/").split("/")[0]
        owner = by_port.get(port) if port is not None else None
        owner = owner or (first if first in names else None)
        if owner is None:
            raise TaskProblem(f"tool {spec.name!r}: no declared service answers {endpoint.url}")
        schema = spec.input_schema if isinstance(spec.input_schema, dict) else {}
        tools.append(
            {
                "name": f"{owner}.{spec.name}",
                "tool_name": spec.name,
                "service": owner,
                "path": path,
                "method": endpoint.method.upper(),
                "url": endpoint.url,
                "description": spec.description or spec.name,
                "schema": {"type": "object", "properties": {}, **schema},
            }
        )
    return {"services": declared, "tools": tools}, claw_eval_services.seed(fixtures)


def _files(task_dir: Path, names: list[str]) -> dict[str, bytes]:
    files = {}
    for name in names:
        found = resolve(task_dir, name)
        if found.stat().st_size > TEXT_LIMIT:
            raise TaskProblem(f"file {name!r} is larger than {TEXT_LIMIT} bytes")
        files[name] = found.read_bytes()
    return files


def _oracle(task_dir: Path) -> list[str]:
    script = task_dir / "oracle.sh"
    if not script.is_file():
        return []
    lines = script.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def build(path: Path, *, image: str) -> Any:
    """One task folder as a ``ClawEvalTask`` (``TaskProblem`` when it cannot run)."""
    from orchard_async.recipes.claw.claw_eval.task import ClawEvalTask

    definition = read_definition(path)
    task_dir = path.parent
    config, seeded = claw_eval_config(definition, task_dir)
    grader_files = _files(task_dir, definition.sandbox_grader_files)
    local_files = _files(task_dir, definition.local_grader_files)
    # into the working directory: the sandbox_files (else, as Claw-Eval does, environment.fixtures)
    # and the prompt's attachments
    given = definition.sandbox_files or definition.environment.fixtures
    sandbox_files = _files(task_dir, list(dict.fromkeys([*given, *definition.prompt.attachments])))
    tools = [tool["name"] for tool in config["tools"]]
    world: dict[str, Any] = {"claw_eval": seeded}
    user = definition.user_agent
    if user.enabled:
        world["user"] = {"persona": user.persona, "max_rounds": user.max_rounds, "default_reply": DEFAULT_USER_REPLY}
        tools.append("user.ask")
    timeout = float(definition.environment.timeout_seconds)
    return ClawEvalTask(
        id=definition.task_id,
        source=path,
        prompt=definition.prompt.text,
        language=definition.prompt.language,
        attachments=list(definition.prompt.attachments),
        category=definition.category,
        spec=SandboxSpec(
            image=image, env={"PATH": services.SANDBOX_PATH, "LANG": "C.UTF-8"}, labels={"orchard.recipe": "claw"}
        ),
        world=world,
        tools=tools,
        checks=[],
        safety=[],
        oracle=_oracle(task_dir),
        max_steps=definition.environment.max_turns,
        deadline=timeout,
        score_timeout=max(60.0, min(300.0, timeout / 2)),
        claw_eval=config,
        definition=definition,
        task_dir=task_dir,
        sandbox_blobs=sandbox_files,
        grader_blobs=grader_files,
        local_grader_blobs=local_files,
        claw_eval_grades=claw_eval_importable(),
    )


def inspect_folder(source: Path, *, image: str) -> tuple[list[Any], list[Problem]]:
    """Every task under ``source``: those that run, and one ``Problem`` per one that cannot."""
    if not source.is_dir():
        raise ConfigError(f"claw-eval:{source}: not a folder of Claw-Eval tasks (<task_id>/task.yaml)")
    paths = task_files(source)
    if not paths:
        raise ConfigError(f"claw-eval:{source}: no task.yaml there nor in its subfolders")
    tasks: list[Any] = []
    problems: list[Problem] = []
    seen: dict[str, Path] = {}
    for path in paths:
        try:
            task = build(path, image=image)
        except TaskProblem as exc:
            problems.append(Problem(path, path.parent.name, str(exc)))
            continue
        if task.id in seen:
            problems.append(Problem(path, task.id, f"task_id is also the id of {seen[task.id]}"))
            continue
        seen[task.id] = path
        tasks.append(task)
    return tasks, problems
