"""A Harbor task folder read as Harbor reads it, without Harbor (it needs Python 3.12).

The layout (Harbor's ``TaskPaths``)::

    instruction.md        the agent's instruction (canary lines stripped)
    task.toml             the config below
    environment/          Dockerfile (or [environment].docker_image)
    solution/solve.sh     the oracle's script, copied to /solution
    tests/test.sh         the verifier, copied to /tests only for verification; it writes
                          /logs/verifier/reward.txt (a float) or reward.json (flat, numeric)
    steps/NAME/           a multi-step task's steps: instruction.md, tests/, solution/,
                          workdir/setup.sh

task.toml (Harbor's ``TaskConfig``; schema 1.4, and the legacy ``version = "1.0"`` with
``memory = "2G"``, ``storage``, ``allow_internet``): the sections ``[environment]``,
``[agent]``, ``[verifier]`` (with ``environment_mode`` and ``[verifier.environment]``),
``[solution]``, ``[[steps]]``, ``artifacts``, ``multi_step_reward_strategy``. Keys this reader
does not use are ignored, as Harbor ignores keys it does not know.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from orchard_async import ConfigError

NETWORK_MODES = ("no-network", "public", "allowlist")
CANARY = re.compile(r"canary", re.IGNORECASE)
_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_ENV_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Where Harbor's tasks find things inside the environment (Harbor's EnvironmentPaths).
LOGS = "/logs"
AGENT_LOGS = "/logs/agent"
VERIFIER_LOGS = "/logs/verifier"
ARTIFACTS = "/logs/artifacts"
TESTS = "/tests"
SOLUTION = "/solution"
REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"
TEST_STDOUT = "/logs/verifier/test-stdout.txt"


@dataclass(frozen=True)
class Network:
    """One role's network policy: Harbor's ``NetworkPolicy``."""

    mode: str = "public"
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Environment:
    """``[environment]`` (or ``[verifier.environment]``)."""

    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    workdir: str | None = None
    network: Network = Network()
    env: dict[str, str] = field(default_factory=dict)
    build_timeout_sec: float = 600.0
    healthcheck: str | None = None  # its command; retried as Harbor does
    healthcheck_retries: int = 3
    healthcheck_interval: float = 5.0
    os: str = "linux"
    mcp_servers: int = 0


@dataclass(frozen=True)
class Phase:
    """``[agent]`` or ``[verifier]`` (a step's too): timeout, user, explicit network override."""

    timeout_sec: float | None = None
    user: str | None = None
    network: Network | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Artifact:
    source: str
    destination: str | None = None


@dataclass(frozen=True)
class Step:
    name: str
    agent: Phase = Phase()
    verifier: Phase = Phase()
    verifier_mode: str | None = None
    verifier_environment: Environment | None = None
    min_reward: float | dict[str, float] | None = None
    artifacts: tuple[Artifact, ...] = ()


@dataclass(frozen=True)
class TaskConfig:
    schema_version: str
    environment: Environment
    agent: Phase
    verifier: Phase
    verifier_mode: str | None  # as written; see ``verifier_mode_of``
    verifier_environment: Environment | None
    solution_env: dict[str, str]
    steps: tuple[Step, ...]
    artifacts: tuple[Artifact, ...]
    multi_step_reward_strategy: str | None
    metadata: dict[str, Any]

    def verifier_mode_of(self, step: Step | None = None) -> str:
        """Harbor's resolution: an explicit mode, else ``separate`` when an environment is
        given for the verifier, else shared (a step first, then the task)."""
        if step is not None:
            if step.verifier_mode:
                return step.verifier_mode
            if step.verifier_environment is not None:
                return "separate"
        if self.verifier_mode:
            return self.verifier_mode
        return "separate" if self.verifier_environment is not None else "shared"

    def agent_network(self, step: Step | None = None) -> Network:
        explicit = (step.agent.network if step else None) or self.agent.network
        return explicit or self.environment.network

    def verifier_environment_of(self, step: Step | None = None) -> Environment | None:
        """The separate verifier's environment (a step's, the task's, else a copy of the
        task's own); None when the verifier shares the agent's."""
        if self.verifier_mode_of(step) != "separate":
            return None
        if step is not None and step.verifier_environment is not None:
            return step.verifier_environment
        return self.verifier_environment or self.environment

    def verifier_network(self, step: Step | None = None) -> Network:
        explicit = (step.verifier.network if step else None) or self.verifier.network
        if explicit is not None:
            return explicit
        separate = self.verifier_environment_of(step)
        return (separate or self.environment).network


def _where(path: str, message: str) -> ConfigError:
    return ConfigError(f"task.toml {path}: {message}")


def _table(data: Any, path: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _where(path, f"must be a table, got {type(data).__name__}")
    return data


def _number(value: Any, path: str, *, integer: bool = False, positive: bool = True) -> Any:
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise _where(path, f"must be a {'whole ' if integer else ''}number, got {value!r}")
    if positive and value <= 0:
        raise _where(path, f"must be positive, got {value!r}")
    return value


def _string(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and path.endswith("user"):
        return str(value)  # a uid
    if not isinstance(value, str):
        raise _where(path, f"must be a string, got {value!r}")
    return value


def _strings(value: Any, path: str) -> dict[str, str]:
    table = _table(value, path)
    for key, item in table.items():
        if not isinstance(item, str):
            raise _where(f"{path}.{key}", f"must be a string, got {item!r}")
    return dict(table)


def size_mb(text: str, path: str) -> int:
    """Harbor's legacy sizes: '2G' -> 2048, '512M' -> 512, '1024K' -> 1."""
    size = text.strip().upper()
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not size or size[-1] not in units:
        raise _where(path, f"{text!r} is not a size like '1G' or '512M'")
    try:
        return int(float(size[:-1]) * units[size[-1]])
    except ValueError:
        raise _where(path, f"{text!r} is not a size like '1G' or '512M'") from None


def allowed_host(host: Any, path: str) -> str:
    """One ``allowed_hosts`` entry as Harbor normalizes it: a host name, ``*.suffix``, an
    IP address or a CIDR range (no URL, port or path)."""
    if not isinstance(host, str) or not host.strip():
        raise _where(path, f"entries must be non-empty host names, got {host!r}")
    name = host.strip().lower().rstrip(".")
    try:
        if "/" in name:
            return ipaddress.ip_network(name, strict=True).compressed
        return ipaddress.ip_address(name).compressed
    except ValueError:
        if "/" in name or ":" in name:
            raise _where(path, f"{host!r} is not a host name, IP address or CIDR range") from None
    labels = (name[2:] if name.startswith("*.") else name).split(".")
    if not all(_HOST_LABEL.match(label) for label in labels):
        raise _where(path, f"{host!r} is not a host name, IP address or CIDR range")
    return name


def _network(data: dict[str, Any], path: str, *, default: str | None) -> Network | None:
    mode = data.get("network_mode")
    hosts = data.get("allowed_hosts")
    if mode is None and "allow_internet" in data and data["allow_internet"] is not None and hosts is None:
        mode = "public" if data["allow_internet"] else "no-network"
    if mode is None:
        if hosts is not None:
            raise _where(f"{path}.allowed_hosts", "is only valid with network_mode = 'allowlist'")
        return None if default is None else Network(default)
    if mode not in NETWORK_MODES:
        raise _where(f"{path}.network_mode", f"unknown network mode {mode!r}; one of {', '.join(NETWORK_MODES)}")
    if hosts is not None and not isinstance(hosts, list):
        raise _where(f"{path}.allowed_hosts", "must be a list of host names")
    if hosts and mode != "allowlist":
        raise _where(f"{path}.allowed_hosts", "is only valid with network_mode = 'allowlist'")
    normal = tuple(allowed_host(h, f"{path}.allowed_hosts") for h in hosts or [])
    return Network(mode, normal)


def _environment(data: Any, path: str) -> Environment:
    table = dict(_table(data, path))
    memory_mb = _number(table.get("memory_mb"), f"{path}.memory_mb", integer=True)
    if isinstance(table.get("memory"), str):  # legacy 1.0
        legacy = size_mb(table["memory"], f"{path}.memory")
        if memory_mb is not None and memory_mb != legacy:
            raise _where(f"{path}.memory", f"{table['memory']!r} conflicts with memory_mb = {memory_mb}")
        memory_mb = legacy
    storage_mb = _number(table.get("storage_mb"), f"{path}.storage_mb", integer=True)
    if isinstance(table.get("storage"), str):
        storage_mb = storage_mb or size_mb(table["storage"], f"{path}.storage")
    workdir = _string(table.get("workdir"), f"{path}.workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise _where(f"{path}.workdir", f"must be an absolute path, got {workdir!r}")
    health = _table(table.get("healthcheck"), f"{path}.healthcheck")
    if health and not isinstance(health.get("command"), str):
        raise _where(f"{path}.healthcheck.command", "is required (a shell command)")
    os_name = str(table.get("os") or "linux").lower()
    if os_name not in ("linux", "windows"):
        raise _where(f"{path}.os", f"must be linux or windows, got {table.get('os')!r}")
    mcp = table.get("mcp_servers") or []
    return Environment(
        docker_image=_string(table.get("docker_image"), f"{path}.docker_image"),
        cpus=_number(table.get("cpus"), f"{path}.cpus"),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        gpus=_number(table.get("gpus"), f"{path}.gpus", integer=True, positive=False),
        workdir=workdir,
        network=_network(table, path, default="public") or Network(),
        env=_strings(table.get("env"), f"{path}.env"),
        build_timeout_sec=_number(table.get("build_timeout_sec", 600.0), f"{path}.build_timeout_sec"),
        healthcheck=health.get("command") if health else None,
        healthcheck_retries=int(_number(health.get("retries", 3), f"{path}.healthcheck.retries", integer=True)),
        healthcheck_interval=float(_number(health.get("interval_sec", 5.0), f"{path}.healthcheck.interval_sec")),
        os=os_name,
        mcp_servers=len(mcp) if isinstance(mcp, list) else 0,
    )


def _phase(data: Any, path: str, *, default_timeout: float | None) -> Phase:
    table = _table(data, path)
    return Phase(
        timeout_sec=_number(table.get("timeout_sec", default_timeout), f"{path}.timeout_sec"),
        user=_string(table.get("user"), f"{path}.user"),
        network=_network(table, path, default=None),
        env=_strings(table.get("env"), f"{path}.env"),
    )


def _verifier_mode(table: dict[str, Any], path: str) -> tuple[str | None, Environment | None]:
    mode = table.get("environment_mode")
    if mode is not None and mode not in ("shared", "separate"):
        raise _where(f"{path}.environment_mode", f"must be 'shared' or 'separate', got {mode!r}")
    environment = _environment(table["environment"], f"{path}.environment") if "environment" in table else None
    if mode == "shared" and environment is not None:
        raise _where(f"{path}.environment_mode", "'shared' is incompatible with a [verifier.environment]")
    return mode, environment


def _artifacts(data: Any, path: str) -> tuple[Artifact, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise _where(path, "must be a list of paths or tables")
    found = []
    for index, item in enumerate(data):
        where = f"{path}[{index}]"
        if isinstance(item, str):
            item = {"source": item}
        table = _table(item, where)
        source = _string(table.get("source"), f"{where}.source")
        if not source:
            raise _where(f"{where}.source", "is required")
        if ".." in PurePosixPath(source).parts:
            raise _where(f"{where}.source", f"must not contain '..', got {source!r}")
        destination = _string(table.get("destination"), f"{where}.destination") or None
        if destination and (destination.startswith("/") or ".." in PurePosixPath(destination).parts):
            raise _where(f"{where}.destination", f"must be a relative path inside the trial, got {destination!r}")
        found.append(Artifact(source, destination))
    return tuple(found)


def _min_reward(value: Any, path: str) -> float | dict[str, float] | None:
    if value is None or isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise _where(path, f"must be a number or a table of numbers, got {value!r}")


def parse_config(text: str) -> TaskConfig:
    """task.toml's text -> ``TaskConfig``; ``ConfigError`` (one line) for what Harbor rejects."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"task.toml is not valid TOML: {exc}") from None
    version = str(data.get("schema_version", data.get("version", "1.4")))
    verifier = _table(data.get("verifier"), "[verifier]")
    mode, verifier_env = _verifier_mode(verifier, "[verifier]")
    steps = []
    raw_steps = data.get("steps")
    if raw_steps is not None and not isinstance(raw_steps, list):
        raise _where("[[steps]]", "must be an array of tables")
    seen: set[str] = set()
    for index, raw in enumerate(raw_steps or []):
        where = f"[[steps]][{index}]"
        table = _table(raw, where)
        name = table.get("name")
        if not isinstance(name, str) or not _STEP_NAME.match(name):
            raise _where(f"{where}.name", f"must be a directory name, got {name!r}")
        if name.lower() in seen:
            raise _where(f"{where}.name", f"step {name!r} appears twice")
        seen.add(name.lower())
        step_verifier = _table(table.get("verifier"), f"{where}.verifier")
        step_mode, step_env = _verifier_mode(step_verifier, f"{where}.verifier")
        steps.append(
            Step(
                name=name,
                agent=_phase(table.get("agent"), f"{where}.agent", default_timeout=None),
                verifier=_phase(step_verifier, f"{where}.verifier", default_timeout=None),
                verifier_mode=step_mode,
                verifier_environment=step_env,
                min_reward=_min_reward(table.get("min_reward"), f"{where}.min_reward"),
                artifacts=_artifacts(table.get("artifacts"), f"{where}.artifacts"),
            )
        )
    strategy = data.get("multi_step_reward_strategy")
    if strategy is not None and strategy not in ("mean", "final"):
        raise _where("multi_step_reward_strategy", f"must be 'mean' or 'final', got {strategy!r}")
    return TaskConfig(
        schema_version=version,
        environment=_environment(data.get("environment"), "[environment]"),
        agent=_phase(data.get("agent"), "[agent]", default_timeout=None),
        verifier=_phase(verifier, "[verifier]", default_timeout=600.0),
        verifier_mode=mode,
        verifier_environment=verifier_env,
        solution_env=_strings(_table(data.get("solution"), "[solution]").get("env"), "[solution].env"),
        steps=tuple(steps),
        artifacts=_artifacts(data.get("artifacts"), "artifacts"),
        multi_step_reward_strategy=strategy,
        metadata=_table(data.get("metadata"), "[metadata]"),
    )


def strip_canary(text: str) -> str:
    """The instruction without its canary lines (the benchmark's do-not-train marker)."""
    return "\n".join(line for line in text.splitlines() if not CANARY.search(line)).strip() + "\n"


def resolve_env(env: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """Harbor's ``${VAR}`` and ``${VAR:-default}`` templates, read from the controller's
    environment; a variable that is unset and has no default is a ``ConfigError``."""
    source = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name, default = match[1], match[2]
        if name in source:
            return source[name]
        if default is not None:
            return default
        raise ConfigError(f"task env needs ${name}, which is not set here (give it a default: ${{{name}:-...}})")

    return {key: _ENV_TEMPLATE.sub(value, item) for key, item in env.items()}


def parse_rewards(reward_json: bytes | None, reward_txt: bytes | None) -> dict[str, float]:
    """Harbor's reward rules: reward.json wins (a flat object of finite numbers, or one
    number), else reward.txt (one finite float, as ``{"reward": x}``). ``ValueError`` (one
    line) for a file that breaks them, ``FileNotFoundError`` when neither exists."""
    if reward_json is not None:
        if not reward_json.strip():
            raise ValueError("reward.json is empty")
        try:
            rewards = json.loads(reward_json)
        except ValueError:
            raise ValueError("reward.json is not JSON") from None
        if not isinstance(rewards, dict):  # Harbor keeps rewards as a mapping of names to numbers
            raise ValueError(f"reward.json must be a flat object of numbers, got {type(rewards).__name__}")
        for item in rewards.values():
            if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
                raise ValueError(f"reward.json holds a non-numeric or non-finite reward {item!r}")
        return {str(k): float(v) for k, v in rewards.items()}
    if reward_txt is not None:
        if not reward_txt.strip():
            raise ValueError("reward.txt is empty")
        try:
            value = float(reward_txt.decode("utf-8", "replace"))
        except ValueError:
            raise ValueError(f"reward.txt is not a number: {reward_txt[:40]!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"reward.txt holds a non-finite reward {value!r}")
        return {"reward": value}
    raise FileNotFoundError("the verifier wrote neither reward.json nor reward.txt")


def headline(rewards: dict[str, float]) -> float:
    """The one number a trajectory's ``reward`` holds: the ``reward`` key when there is one
    (Harbor's one-dimensional convention), else the mean of the metrics."""
    if "reward" in rewards:
        return rewards["reward"]
    return sum(rewards.values()) / len(rewards) if rewards else 0.0


def read_config(folder: Path) -> TaskConfig:
    path = folder / "task.toml"
    if not path.is_file():
        raise ConfigError("no task.toml")
    return parse_config(path.read_text(encoding="utf-8", errors="replace"))
