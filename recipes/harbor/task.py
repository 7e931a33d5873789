"""Harbor task folders as orchard-async tasks.

An episode runs as Harbor's trial does: the environment (the task's image, its resources,
workdir, env and the agent phase's network), the instruction to the agent, then the
verifier: ``tests/`` copied to ``/tests`` only now, ``tests/test.sh`` run as the verifier's
user with its env and timeout, the reward read from ``/logs/verifier`` by Harbor's rules
(``config.parse_rewards``). What the agent cannot forge:

* ``environment_mode = "shared"`` (the default): before verification every process the
  agent left is killed (all but the sandbox's own, recorded after setup), and ``/tests``,
  ``/logs/verifier`` and ``/solution`` are removed and ``/tests`` written afresh from the
  task folder; a planted reward file or test, or a process still writing, counts for nothing.
* ``environment_mode = "separate"``: the task is graded apart (``GradedApart``): only the
  declared artifacts (and ``/logs/artifacts``) leave the agent's sandbox, which is then
  destroyed; the verifier runs in a fresh sandbox of the verifier's environment.

Multi-step tasks (``[[steps]]``) run as Harbor's trial runs them: one agent run per step,
with that step's instruction, then that step's verifier, a step below its ``min_reward``
ending the episode; the rewards aggregated as Harbor does (``mean`` or ``final``). The
engine runs one agent phase per episode, so the steps are driven from the policy's side
(``steps.Stepwise``, which wraps every policy of ``make_policy``): when the agent ends a step
(it submits, or the step's turns or time run out), ``end_step`` verifies it in the agent's
sandbox (shared mode: the agent's processes ended and ``/tests`` fresh, as for the last step),
stages the next step's ``workdir/`` and ``setup.sh``, and the agent starts again on the next
instruction; the last step is verified by ``evaluate``. With a separate verifier, each step's
artifacts are collected when it ends and every step is verified in the verifier's sandbox at
the end (the gating then only stops the counting). A step the episode never reached (its
turns or time ran out in an earlier step) counts 0: Harbor would have run it.
"""

from __future__ import annotations

import base64
import io
import json
import posixpath
import shlex
import socket
import tarfile
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import anyio
import msgspec

from orchard_async import (
    OFFLINE,
    ONLINE,
    ConfigError,
    NetworkPolicy,
    PhaseNetworks,
    RecipeOptions,
    Reward,
    Sandbox,
    SandboxSpec,
    episode_label,
    recipe_option,
)
from orchard_async.capabilities import NetworkControl, network_policy
from orchard_async.protocols import TIMER_NAME
from orchard_async.recipes.harbor import config as cfg
from orchard_async.recipes.harbor import images
from orchard_async.recipes.harbor.config import Step, TaskConfig

AGENT_TIMEOUT = 600.0  # Harbor's agent timeout when the task names none
SETUP_BUDGET = 300.0  # seconds of the deadline for setup: staging, replaying a Dockerfile, healthcheck
SCORE_MARGIN = 60.0  # on top of the verifier's timeout: killing, copying tests, reading rewards
MAX_STEPS = 50
WRITABLE = (cfg.LOGS, cfg.TESTS, cfg.SOLUTION)  # Harbor's absolute paths every sandbox must have

# Every process in the sandbox as "pid:starttime", so a reused pid is not taken for an old one,
# and the adapter's TTL timers (TIMER_NAME in their argv; never PID 1, which adopts every
# orphan) once more as "timer=pid:starttime". Taken before the agent acts, so the agent cannot
# pass a process of its own off as a timer. A process gone between the glob and its read is
# skipped, and must not make the listing fail: a loop's status is its last command's, and the
# last process listed may be one that is ending.
LIST_PROCESSES = rf"""for d in /proc/[0-9]*; do p=${{d#/proc/}}; s=$(cut -d' ' -f22 "$d/stat" 2>/dev/null) || continue
echo "$p:$s"; [ "$p" != 1 ] && tr '\0' '\n' <"$d/cmdline" 2>/dev/null | grep -qx {TIMER_NAME} && echo "timer=$p:$s"
done; :"""
# Kills every process not in the baseline (written into the script: the agent, root in many
# images, could edit a file in the sandbox), not a child of a timer in it (the timer's later
# sleeps: a sandbox whose timer is killed ends, or, where the timer outlives its sleep, the
# passes below never run out) and not this script's own ancestry, until a pass finds none (a
# process that forks is caught by the next pass). The agent cannot make a process a timer's
# child: an orphan goes to PID 1. Only processes of this script's own cgroup, the sandbox's: a
# pod's other containers share its PID namespace (the kubernetes adapter's egress filter), and
# the agent cannot leave its cgroup (cgroupfs is read-only to it).
KILL_OTHERS = r"""
keep=" $KEEP "
cgroup() { g=; while read -r line; do g="$g$line;"; done < "$1"; }  # every line: cgroup v1 has one a hierarchy
cgroup /proc/self/cgroup; own=$g
read -r p _ < /proc/self/stat  # this shell's own pid ($$ is the outer one in a wrapped script)
mine=" "
while [ -n "$p" ] && [ "$p" != 0 ]; do mine="$mine$p "; p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null); done
n=0
while [ $n -lt 50 ]; do
  found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$mine" in *" $p "*) continue;; esac
    cgroup "$d/cgroup" 2>/dev/null && [ "$g" = "$own" ] || continue
    s=$(cut -d' ' -f22 "$d/stat" 2>/dev/null) || continue
    case "$keep" in *" $p:$s "*) continue;; esac
    pp=$(sed -n 's/^PPid:[[:space:]]*//p' "$d/status" 2>/dev/null) && ps=$(cut -d' ' -f22 "/proc/$pp/stat" 2>/dev/null) &&
      case "$keep" in *" timer=$pp:$ps "*) continue;; esac
    kill -KILL "$p" 2>/dev/null && found=$((found+1))
  done
  [ $found = 0 ] && exit 0
  n=$((n+1)); sleep 0.05
done
echo "processes kept respawning" >&2; exit 1
"""
ENV_FILE = "/tmp/.orchard-harbor-env"
BUILTIN = Path(__file__).resolve().parent / "builtin"  # three small tasks (builtin/README.md)


class HarborOptions(RecipeOptions, frozen=True):
    """The Harbor recipe's options (``--recipe-options``, or keywords of ``load_tasks``)."""

    RECIPE: ClassVar[str] = "harbor"

    image_map: Annotated[
        dict[str, str], recipe_option("base images the tasks name -> local images that stand in for them")
    ] = {}
    ids: Annotated[tuple[str, ...] | None, recipe_option("only these tasks (folder names)")] = None
    max_steps: Annotated[int, recipe_option("agent turns per episode (per step of a multi-step task)", ge=1)] = (
        MAX_STEPS
    )
    harness: Annotated[
        str,
        recipe_option(
            "the harness policy's agent: a preset (bundled, mini-swe-agent) or a command in the task's image "
            "that reads the instruction from stdin"
        ),
    ] = "bundled"
    exec_timeout: Annotated[float, recipe_option("seconds per agent command", gt=0)] = 300.0
    agent_timeout: Annotated[
        float, recipe_option("seconds for the agent when the task names none ([agent].timeout_sec)", gt=0)
    ] = AGENT_TIMEOUT
    pass_threshold: Annotated[float, recipe_option("reward at or above which an episode counts as solved")] = 1.0


@dataclass
class SandboxState:
    """What a task learned about one sandbox at setup."""

    root: bool = True  # commands run as root: users can be switched, processes killed
    replayed: bool = False  # the image did not run (local): the Dockerfile was replayed
    baseline: bytes = b""  # the sandbox's own processes after setup, kept here, out of the agent's reach
    step: int = 0  # the step the agent is on (multi-step tasks)
    step_started: float = 0.0  # monotonic time the agent's run on ``step`` began
    step_offset: int = 0  # the episode's turn at which ``step`` began
    stopped: bool = False  # a step fell below its min_reward: no later step runs
    verified: dict[str, dict[str, float] | None] = field(default_factory=dict)  # step -> rewards (None: no verdict)
    errors: dict[str, str] = field(default_factory=dict)  # step -> why it has no verdict
    snapshots: dict[str, str] = field(default_factory=dict)  # step -> its artifacts (separate verifier)


def quote(text: str) -> str:
    return shlex.quote(text)


def emptied(*dirs: str) -> str:
    """A command leaving each dir empty and a real dir (a mount point stays where it is; a
    symlink or file the agent put in its place is removed first)."""
    steps = []
    for path in map(quote, dirs):
        steps.append(f"{{ if [ -L {path} ] || {{ [ -e {path} ] && [ ! -d {path} ]; }}; then rm -rf {path}; fi; "
                     f"mkdir -p {path} && find {path} -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} +; }}")  # fmt: skip
    return " && ".join(steps)


def files_of(folder: Path) -> list[tuple[str, bytes, int]]:
    """(relative path, content, mode) of every file under ``folder``."""
    if not folder.is_dir():
        return []
    return [
        (str(path.relative_to(folder)), path.read_bytes(), path.stat().st_mode & 0o777)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    ]


async def check(sandbox: Sandbox, command: str, what: str, *, timeout: float = 120.0, **kw: Any) -> str:
    result = await sandbox.exec(command, timeout=timeout, **kw)
    if not result.ok:
        tail = (result.error_text or result.text).strip().splitlines()
        raise RuntimeError(f"{what} failed ({result.reason.value}): {tail[-1] if tail else 'no output'}")
    return result.text


async def upload(sandbox: Sandbox, folder: Path, target: str) -> None:
    for relative, data, mode in files_of(folder):
        path = posixpath.join(target, relative)
        await check(sandbox, f"mkdir -p {quote(posixpath.dirname(path))}", f"mkdir for {path}")
        await sandbox.write_file(path, data, mode=mode | 0o600)


def egress_rules(network: cfg.Network) -> list[dict[str, Any]]:
    """Harbor's ``allowed_hosts`` as egress rules by address (names resolved here, now)."""
    rules: list[dict[str, Any]] = []
    for host in network.allowed_hosts:
        if host.startswith("*."):
            raise ConfigError(f"allowed host {host!r}: a wildcard cannot be enforced by address")
        try:
            addresses = (
                {host}
                if host[0].isdigit() or ":" in host
                else {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
            )
        except OSError as exc:
            raise ConfigError(f"allowed host {host!r} does not resolve here: {exc}") from None
        rules.extend({"cidr": address, "port_start": 1, "port_end": 65535} for address in sorted(addresses))
    return rules


def policy_of(network: cfg.Network) -> NetworkPolicy:
    """A Harbor network mode as the library's policy: public is enabled, no-network restricted
    to nothing, an allowlist restricted to its hosts' addresses."""
    if network.mode == "public":
        return ONLINE
    if network.mode == "no-network":
        return OFFLINE
    return network_policy("restricted", egress_rules(network))


def phase_networks(setup: cfg.Network, agent: cfg.Network, scoring: cfg.Network) -> PhaseNetworks | None:
    """The engine's per-phase networks for Harbor's (the environment's baseline for setup, the
    agent's, the verifier's); None when every phase is public or every one offline (the
    sandbox is made so and never switched)."""
    if all(n.mode == "public" for n in (setup, agent, scoring)) or all(
        n.mode == "no-network" for n in (setup, agent, scoring)
    ):
        return None
    return PhaseNetworks(setup=policy_of(setup), agent=policy_of(agent), scoring=policy_of(scoring))


async def apply_network(sandbox: Any, network: cfg.Network) -> None:
    """Switch a sandbox that can (``NetworkControl``) to ``network``; ``ConfigError`` for one
    that cannot."""
    if not isinstance(sandbox, NetworkControl):
        raise ConfigError(f"network_mode {network.mode!r} needs an adapter whose sandboxes switch egress (set_network)")
    policy = policy_of(network)
    await sandbox.set_network(policy.mode, policy.allow)


@dataclass(eq=False)
class HarborTask:
    """One Harbor task folder (``environment_mode = "shared"``: graded in the agent's sandbox)."""

    folder: Path
    config: TaskConfig
    instruction: str
    spec: SandboxSpec
    image_map: dict[str, str]
    max_steps: int = MAX_STEPS
    step_turns: int = MAX_STEPS  # turns of one step (multi-step tasks: max_steps is this times the steps)
    deadline: float = 1800.0
    score_timeout: float = 660.0
    exec_timeout: float = 300.0
    pass_threshold: float = 1.0
    built_image: str | None = None  # the tag a Dockerfile task's image is built as
    agent_timeout: float = AGENT_TIMEOUT  # the agent's seconds when the task names none
    replay: images.ReplayPlan = field(default_factory=images.ReplayPlan)  # its Dockerfile, for sandboxes without it
    network: PhaseNetworks | None = None  # Harbor's per-phase networks, switched by the engine
    id: str = ""
    _states: dict[str, SandboxState] = field(default_factory=dict, repr=False)
    # the agent's sandbox by its episode label, for a policy that drives the sandbox itself
    # (the harness) and for the step runner (``steps``); weak: an episode that ends before its
    # scoring (which drops it) leaves nothing behind
    sandboxes: weakref.WeakValueDictionary[str, Sandbox] = field(
        default_factory=weakref.WeakValueDictionary, repr=False
    )

    def __post_init__(self) -> None:
        self.id = self.id or self.folder.name

    # -- what the policies use ---------------------------------------------------------

    @property
    def workdir(self) -> str | None:
        return self.config.environment.workdir

    @property
    def agent_user(self) -> str | None:
        return self.config.agent.user

    def state(self, sandbox: Sandbox) -> SandboxState:
        state = self._states.get(sandbox.id)
        if state is None:
            state = self._states[sandbox.id] = SandboxState()
            # dropped with its sandbox: a training run's tasks meet new sandboxes for hours
            weakref.finalize(sandbox, self._states.pop, sandbox.id, None)
        return state

    def as_user(self, command: str, user: str | None, *, cwd: str | None = None, agent: bool = False,
                env: Mapping[str, str] | None = None) -> str:  # fmt: skip
        """``command`` as ``user`` (switched only where commands run as root: a local sandbox
        has one user), in ``cwd`` (else the task's workdir), with ``env``. ``agent``: first
        read ``ENV_FILE``, what a replayed Dockerfile set (the agent may change that file, so
        the verifier never reads it: it gets the same values from the task itself)."""
        prefix = f"[ -r {ENV_FILE} ] && . {ENV_FILE}; " if agent else ""
        exports = "".join(f"export {k}={quote(v)}; " for k, v in (env or {}).items())
        where = cwd or self.workdir
        body = f"{prefix}{exports}{f'cd {quote(where)} && ' if where else ''}{command}"
        if user is None or str(user) in ("root", "0"):
            return body
        return f'if [ "$(id -u)" = 0 ]; then su -s /bin/sh {quote(user)} -c {quote(body)}; else sh -c {quote(body)}; fi'

    def agent_command(self, command: str) -> str:
        """An agent's command as Harbor runs it: as the agent user, in the workdir."""
        return self.as_user(command, self.agent_user, agent=True)

    def verifier_env(self, sandbox: Sandbox, extra: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
        """The verifier's env and working directory, from the task (never from the sandbox)."""
        state = self.state(sandbox)
        env = {**(self.replay.env if state.replayed else {}), **extra}
        return env, self.workdir or (self.replay.workdir if state.replayed else None)

    def sandbox_of(self, episode_id: str) -> Sandbox:
        sandbox = self.sandboxes.get(episode_label(episode_id))
        if sandbox is None:
            raise RuntimeError(f"{self.id}: no sandbox of episode {episode_id} (its setup did not run here)")
        return sandbox

    def step_of(self, episode_id: str) -> int:
        """The step episode ``episode_id`` is on (0 for a one-step task, or before setup)."""
        sandbox = self.sandboxes.get(episode_label(episode_id))
        return self.state(sandbox).step if sandbox is not None else 0

    def step_instruction(self, index: int) -> str:
        if not self.config.steps:
            return self.instruction
        step = self.config.steps[index]
        return cfg.strip_canary((self.folder / "steps" / step.name / "instruction.md").read_text())

    def step_timeout(self, index: int) -> float:
        """The agent's seconds for step ``index`` (``[steps.agent].timeout_sec``, else the task's)."""
        step = self.config.steps[index] if self.config.steps else None
        return (step.agent.timeout_sec if step else None) or self.config.agent.timeout_sec or self.agent_timeout

    def solutions(self) -> list[tuple[Path, dict[str, str]]]:
        """The oracle's scripts in order: each step's ``solve.sh``, or the task's."""
        if self.config.steps:
            return [
                (self.folder / "steps" / step.name / "solution", self.config.solution_env) for step in self.config.steps
            ]
        return [(self.folder / "solution", self.config.solution_env)]

    # -- setup -----------------------------------------------------------------------------

    async def setup(self, sandbox: Sandbox) -> str:
        state = self.state(sandbox)
        state.root = (await check(sandbox, "id -u", "reading the sandbox's user")).strip() == "0"
        await self._check_users(sandbox)
        dirs = [cfg.AGENT_LOGS, cfg.VERIFIER_LOGS, cfg.ARTIFACTS, *([self.workdir] if self.workdir else [])]
        await check(sandbox, f"mkdir -p {' '.join(map(quote, dirs))} && chmod 777 {cfg.AGENT_LOGS} {cfg.VERIFIER_LOGS} "
                    f"{cfg.ARTIFACTS}", "creating Harbor's directories")  # fmt: skip
        environment = self.folder / "environment"
        marker = await sandbox.exec(f"cat {images.MARKER}", timeout=30)
        if (environment / "Dockerfile").is_file() and not marker.ok:
            await self._replay(sandbox, environment)  # no image ran here (local): do what its Dockerfile does
        elif self.config.environment.docker_image and not (environment / "Dockerfile").is_file():
            await upload(sandbox, environment, self.workdir or "/")  # as Harbor does for a prebuilt image
        if self.config.steps:
            await self._stage_step(sandbox, self.config.steps[0])
        await self._healthcheck(sandbox)
        state.baseline = (await check(sandbox, LIST_PROCESSES, "listing the sandbox's processes")).encode()
        self.sandboxes[sandbox.labels.get("orchard.episode", sandbox.id)] = sandbox
        state.step_started = time.monotonic()
        return self.step_instruction(0)

    async def _check_users(self, sandbox: Sandbox) -> None:
        """A non-root agent or verifier user must be one the sandbox can switch to: root
        without the capability to change uid (the docker adapter drops every capability)
        cannot, and running the agent as root instead would change what the task tests."""
        if not self.state(sandbox).root:
            return  # one unprivileged user (local): every phase runs as it
        users = {u for u in (self.agent_user, self.config.verifier.user, *(s.agent.user for s in self.config.steps),
                             *(s.verifier.user for s in self.config.steps)) if u and str(u) not in ("root", "0")}  # fmt: skip
        for user in sorted(users):
            probe = await sandbox.exec(f"su -s /bin/sh {quote(user)} -c true", timeout=30)
            if not probe.ok:
                raise RuntimeError(
                    f"user {user!r}: this sandbox cannot switch to it ({probe.error_text.strip() or 'su failed'}); "
                    "the adapter must run commands as another user"
                )

    async def _replay(self, sandbox: Sandbox, environment: Path) -> None:
        plan = self.replay
        self.state(sandbox).replayed = True
        lines = [f"export {k}={quote(v)}" for k, v in plan.env.items()]
        if plan.workdir and not self.workdir:
            lines.append(f"cd {quote(plan.workdir)}")
        await sandbox.write_file(ENV_FILE, "\n".join(lines) + "\n", mode=0o644)
        cwd = plan.workdir or "/"
        for kind, first, second in plan.steps:
            if kind == "run":
                await check(sandbox, self.as_user(first, None, cwd=second, env=plan.env), f"Dockerfile RUN {first[:60]!r}",
                            timeout=self.config.environment.build_timeout_sec)  # fmt: skip
                continue
            source = context_path(environment, first)
            target = second if second.startswith("/") else posixpath.join(cwd, second)
            if source.is_dir():
                await upload(sandbox, source, target)
            else:
                if target.endswith("/"):
                    target = posixpath.join(target, source.name)
                await check(sandbox, f"mkdir -p {quote(posixpath.dirname(target))}", "mkdir for COPY")
                await sandbox.write_file(target, source.read_bytes(), mode=source.stat().st_mode & 0o777 | 0o600)

    async def _stage_step(self, sandbox: Sandbox, step: Step) -> None:
        staged = self.folder / "steps" / step.name / "workdir"
        workdir = self.verifier_env(sandbox, {})[1] or "/"
        for relative, data, mode in files_of(staged):
            if relative == "setup.sh":
                continue
            path = posixpath.join(workdir, relative)
            await check(sandbox, f"mkdir -p {quote(posixpath.dirname(path))}", "staging a step's files")
            await sandbox.write_file(path, data, mode=mode | 0o600)
        if (staged / "setup.sh").is_file():
            await sandbox.write_file("/tmp/.harbor-step-setup.sh", (staged / "setup.sh").read_bytes(), mode=0o755)
            env, cwd = self.verifier_env(sandbox, {})
            await check(
                sandbox,
                self.as_user("sh /tmp/.harbor-step-setup.sh", None, cwd=cwd, env=env),
                f"step {step.name} setup.sh",
            )

    async def _healthcheck(self, sandbox: Sandbox) -> None:
        environment = self.config.environment
        if not environment.healthcheck:
            return
        last = ""
        for _ in range(max(1, environment.healthcheck_retries)):
            env, cwd = self.verifier_env(sandbox, {})
            result = await sandbox.exec(self.as_user(environment.healthcheck, None, cwd=cwd, env=env), timeout=30)
            if result.ok:
                return
            last = (result.error_text or result.text).strip()[-200:]
            await anyio.sleep(environment.healthcheck_interval)
        raise RuntimeError(f"healthcheck {environment.healthcheck!r} never passed: {last}")

    # -- verification ----------------------------------------------------------------------

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        """Shared mode: end the agent's processes, restore the verifier's dirs, verify (a
        multi-step task: the step the agent is on, the earlier ones having been verified as
        they ended)."""
        state = self.state(sandbox)
        self.sandboxes.pop(sandbox.labels.get("orchard.episode", sandbox.id), None)
        await self._end_agent_processes(sandbox)
        if not self.config.steps:
            return await self.verify_all(sandbox)
        started = time.monotonic()
        if not state.stopped:
            await self._verify_recorded(sandbox, self.config.steps[state.step], state)
        return self._aggregate(state, started)

    async def _end_agent_processes(self, sandbox: Sandbox) -> None:
        # In a sandbox of one user (local) the agent's processes are that user's, too.
        keep = " ".join(self.state(sandbox).baseline.decode().split())
        await check(sandbox, KILL_OTHERS.replace("$KEEP", keep), "ending the agent's processes")

    async def end_step(self, episode_id: str) -> dict[str, Any]:
        """The agent's run on its step ended and a later step remains: verify the step in the
        agent's sandbox (its processes ended first, under the verifier's network), then, unless
        it fell below its ``min_reward`` or has no verdict (``stopped``), stage the next step.
        Returns what the trajectory keeps of it."""
        sandbox = self.sandbox_of(episode_id)
        state = self.state(sandbox)
        step = self.config.steps[state.step]
        await self._end_agent_processes(sandbox)
        async with self._phase_network(sandbox, step):
            await self._verify_recorded(sandbox, step, state)
        # Harbor resets the shared verifier's dirs before the next agent run sees them.
        await check(sandbox, emptied(cfg.TESTS, cfg.VERIFIER_LOGS) + f" && chmod 777 {cfg.VERIFIER_LOGS}",
                    "resetting /tests and /logs/verifier")  # fmt: skip
        report: dict[str, Any] = {"step": step.name, "rewards": state.verified[step.name]}
        if step.name in state.errors:
            report["error"] = state.errors[step.name]
        state.stopped = _stops(state, step)
        if not state.stopped:
            report["next"] = await self._next_step(sandbox, state)
        report["stopped"] = state.stopped
        return report

    async def _next_step(self, sandbox: Sandbox, state: SandboxState) -> str:
        state.step += 1
        step = self.config.steps[state.step]
        await self._stage_step(sandbox, step)
        # what the step's setup started is the sandbox's own, not the agent's
        state.baseline = (await check(sandbox, LIST_PROCESSES, "listing the sandbox's processes")).encode()
        state.step_started = time.monotonic()
        return step.name

    @asynccontextmanager
    async def _phase_network(self, sandbox: Sandbox, step: Step) -> AsyncIterator[None]:
        """The step's verifier network while it is verified between agent runs (the engine
        switches per phase of the episode; a step ends inside its agent phase), then the
        agent's again."""
        agent, verifier = self.config.agent_network(step), self.config.verifier_network(step)
        if self.network is None or policy_of(agent) == policy_of(verifier):
            yield
            return
        inner = getattr(sandbox, "inner", sandbox)  # the engine's recording wrapper does not switch
        await apply_network(inner, verifier)
        try:
            yield
        finally:
            following = self.config.steps[min(self.state(sandbox).step + 1, len(self.config.steps) - 1)]
            await apply_network(inner, self.config.agent_network(following))

    async def _verify_recorded(self, sandbox: Sandbox, step: Step, state: SandboxState) -> None:
        """Verify ``step`` and keep its rewards (None and the reason when it has no verdict)."""
        try:
            state.verified[step.name] = await self.verify_step(sandbox, step)
        except (ValueError, FileNotFoundError) as exc:  # no verdict for this step, as Harbor's verifier crash
            state.verified[step.name] = None
            state.errors[step.name] = str(exc)

    def _aggregate(self, state: SandboxState, started: float) -> Reward:
        """The steps' rewards as Harbor aggregates them (``mean`` per key over the steps with a
        verdict, or the ``final`` step's); a step the episode never reached counts 0."""
        per_step: dict[str, dict[str, float] | None] = {}
        errors = dict(state.errors)
        unreached = []
        for step in self.config.steps:
            if step.name in state.verified:
                per_step[step.name] = state.verified[step.name]
            elif not state.stopped:
                unreached.append(step.name)
                errors[step.name] = "not reached: the episode ended in an earlier step"
        results = [r for r in per_step.values() if r is not None]
        if self.config.multi_step_reward_strategy == "final":
            rewards = ({} if unreached else list(per_step.values())[-1] or {}) if per_step else {}
        else:
            keys = {key for r in results for key in r}
            count = len(results) + len(unreached)
            rewards = {key: sum(r.get(key, 0.0) for r in results) / count for key in keys} if results else {}
        info = {
            "rewards": rewards,
            "steps": {**per_step, **dict.fromkeys(unreached)},
            **({"errors": errors} if errors else {}),
            "score_s": round(time.monotonic() - started, 3),
        }
        return self.reward(rewards, info)

    async def verify_all(self, sandbox: Sandbox) -> Reward:
        """A one-step task's verification."""
        started = time.monotonic()
        # A verifier that wrote no reward, or one Harbor rejects, scores 0 with the reason
        # (Harbor records a verifier error): the agent may have broken what the test needs.
        try:
            rewards = await self.verify_step(sandbox, None)
        except (ValueError, FileNotFoundError) as exc:
            return self.reward({}, {"rewards": {}, "error": str(exc)})
        return self.reward(rewards, {"rewards": rewards, "score_s": round(time.monotonic() - started, 3)})

    def reward(self, rewards: dict[str, float], info: dict[str, Any]) -> Reward:
        value = cfg.headline(rewards)
        return Reward(value=value, success=value >= self.pass_threshold, info={"task": self.id, **info})

    async def verify_step(self, sandbox: Sandbox, step: Step | None) -> dict[str, float]:
        """One verification: ``/tests`` and ``/logs/verifier`` fresh, the test script run as
        the verifier's user, the rewards read by Harbor's rules (ValueError when they break
        them, FileNotFoundError when there are none)."""
        await check(sandbox, emptied(cfg.TESTS, cfg.VERIFIER_LOGS, cfg.SOLUTION) + f" && chmod 777 {cfg.VERIFIER_LOGS}",
                    "restoring /tests and /logs/verifier")  # fmt: skip
        tests = self.folder / "tests"
        script = "test.sh"
        await upload(sandbox, tests, cfg.TESTS)
        if step is not None:
            step_tests = self.folder / "steps" / step.name / "tests"
            await upload(sandbox, step_tests, cfg.TESTS)
        user = (step.verifier.user if step else None) or self.config.verifier.user
        env, cwd = self.verifier_env(
            sandbox, cfg.resolve_env({**self.config.verifier.env, **(step.verifier.env if step else {})})
        )
        timeout = (step.verifier.timeout_sec if step else None) or self.config.verifier.timeout_sec or 600.0
        await check(sandbox, f"chmod -R a+rX {cfg.TESTS} && chmod +x {cfg.TESTS}/{script}", "chmod of the tests")
        run = f"{cfg.TESTS}/{script} > {cfg.TEST_STDOUT} 2>&1"
        result = await sandbox.exec(self.as_user(run, user, cwd=cwd, env=env), timeout=timeout)
        if result.reason.is_infra:
            raise RuntimeError(f"the verifier's sandbox was lost: {result.error_text}")
        reward_json = await _read_optional(sandbox, cfg.REWARD_JSON)
        reward_txt = await _read_optional(sandbox, cfg.REWARD_TXT)
        return cfg.parse_rewards(reward_json, reward_txt)


def context_path(context: Path, name: str) -> Path:
    """A COPY source inside the build context; RuntimeError for one outside it or missing."""
    source = (context / name).resolve()
    if not source.is_relative_to(context.resolve()) or not source.exists():
        raise RuntimeError(f"Dockerfile COPY {name!r}: not in the build context")
    return source


def _stops(state: SandboxState, step: Step) -> bool:
    """Harbor stops after a step without a verdict, or one below its ``min_reward``."""
    rewards = state.verified.get(step.name)
    return rewards is None or not _meets(rewards, step.min_reward)


def _meets(rewards: dict[str, float] | None, minimum: float | dict[str, float] | None) -> bool:
    if minimum is None:
        return True
    if rewards is None:
        return False
    if isinstance(minimum, dict):
        return all(rewards.get(key, float("-inf")) >= value for key, value in minimum.items())
    return rewards.get("reward", float("-inf")) >= minimum


async def _read_optional(sandbox: Sandbox, path: str) -> bytes | None:
    exists = await sandbox.exec(f"test -f {quote(path)}", timeout=30)
    if not exists.ok:
        return None
    return await sandbox.read_file(path)


ARTIFACT_TAR = "/tmp/.orchard-harbor-artifacts.tgz"


@dataclass(eq=False)
class SeparateHarborTask(HarborTask):
    """``environment_mode = "separate"``: graded apart. The submission is the artifacts
    (``/logs/artifacts`` and the declared ``artifacts``) as a tar; the verifier runs in a
    fresh sandbox of the verifier's environment with them put back where they were."""

    scorer_spec: SandboxSpec | None = None  # the verifier environment's sandbox (engine: plan.scorer_spec)

    def artifact_paths(self, sandbox: Sandbox) -> list[str]:
        """The absolute paths that may cross to the verifier: ``/logs/artifacts`` and every
        declared artifact (a relative one is in the workdir)."""
        sources = [cfg.ARTIFACTS, *(a.source for a in self.config.artifacts)]
        for step in self.config.steps:
            sources.extend(a.source for a in step.artifacts)
        workdir = self.verifier_env(sandbox, {})[1] or "/"
        return [
            posixpath.normpath(s if s.startswith("/") else posixpath.join(workdir, s)) for s in dict.fromkeys(sources)
        ]

    async def _pack(self, sandbox: Sandbox) -> str:
        listed = " ".join(quote(p.lstrip("/")) for p in self.artifact_paths(sandbox))
        pack = f'cd / && set -- && for p in {listed}; do [ -e "$p" ] && set -- "$@" "$p"; done; tar czf {ARTIFACT_TAR} "$@"'
        await check(sandbox, pack, "collecting the artifacts", timeout=300)
        return base64.b64encode(await sandbox.read_file(ARTIFACT_TAR)).decode()

    async def submission(self, sandbox: Sandbox) -> str:
        """The artifacts as a tar (base64); a multi-step task's, a JSON object of each step
        reached -> its artifacts as they were when it ended."""
        self.sandboxes.pop(sandbox.labels.get("orchard.episode", sandbox.id), None)
        packed = await self._pack(sandbox)
        if not self.config.steps:
            return packed
        state = self.state(sandbox)
        return json.dumps({**state.snapshots, self.config.steps[state.step].name: packed})

    async def end_step(self, episode_id: str) -> dict[str, Any]:
        """A separate verifier grades every step at the end: the step's artifacts are kept as
        they are now, and the next step is staged."""
        sandbox = self.sandbox_of(episode_id)
        state = self.state(sandbox)
        step = self.config.steps[state.step]
        state.snapshots[step.name] = await self._pack(sandbox)
        return {"step": step.name, "rewards": None, "verified": "at the end (separate verifier)",
                "next": await self._next_step(sandbox, state), "stopped": False}  # fmt: skip

    async def grade(self, submission: str, sandbox: Sandbox) -> Reward:
        state = self.state(sandbox)
        state.root = (await check(sandbox, "id -u", "reading the verifier sandbox's user")).strip() == "0"
        dirs = f"{cfg.VERIFIER_LOGS} {cfg.ARTIFACTS}"
        await check(sandbox, f"mkdir -p {dirs} && chmod 777 {dirs}", "creating the verifier's directories")
        if not self.config.steps:
            written, refused = await self._put_artifacts(sandbox, submission)
            reward = await self.verify_all(sandbox)
        else:
            # each step reached, in order, with the artifacts it ended with (the previous
            # step's removed first), until one stops the rest
            started = time.monotonic()
            written, refused = [], []
            snapshots = json.loads(submission)
            for step in self.config.steps:
                if step.name not in snapshots:
                    break
                files, rejected = await self._put_artifacts(sandbox, snapshots[step.name])
                written, refused = written + files, refused + rejected
                await self._verify_recorded(sandbox, step, state)
                if files:
                    await check(sandbox, "rm -f -- " + " ".join(map(quote, files)), "removing a step's artifacts")
                if _stops(state, step):
                    state.stopped = True
                    break
            reward = self._aggregate(state, started)
        reward.info["artifacts"] = sorted(set(written))
        if refused:
            reward.info["artifacts_refused"] = refused[:20]
        return reward

    async def _put_artifacts(self, sandbox: Sandbox, packed: str) -> tuple[list[str], list[str]]:
        """The tar was made in the agent's sandbox, by its tar: read here, and only regular
        files below the declared paths are written into the verifier's sandbox."""
        files, refused = artifact_files(base64.b64decode(packed), self.artifact_paths(sandbox))
        for path, data, mode in files:
            await check(sandbox, f"mkdir -p {quote(posixpath.dirname(path))}", "putting the artifacts back")
            await sandbox.write_file(path, data, mode=mode)
        return [path for path, _, _ in files], refused


ARTIFACT_LIMIT = 256 << 20  # bytes of artifacts one episode may carry to its verifier


def artifact_files(packed: bytes, allowed: list[str]) -> tuple[list[tuple[str, bytes, int]], list[str]]:
    """The regular files of a tar (gzip) that lie below one of ``allowed`` (absolute paths),
    as (path, data, mode without set-id bits); and the members refused (links, devices, paths
    that leave the allowed ones)."""
    roots = [a.rstrip("/") for a in allowed]
    files: list[tuple[str, bytes, int]] = []
    refused: list[str] = []
    total = 0
    if not packed:
        return files, refused
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:*") as tar:
        for member in tar:
            path = "/" + posixpath.normpath(member.name.lstrip("/"))
            inside = any(path == root or path.startswith(root + "/") for root in roots)
            if member.isdir():  # directories are made as the files below them need them
                continue
            if not member.isfile() or not inside or ".." in member.name.split("/"):
                refused.append(member.name)
                continue
            total += member.size
            if total > ARTIFACT_LIMIT:
                raise RuntimeError(f"the artifacts exceed {ARTIFACT_LIMIT >> 20} MiB")
            handle = tar.extractfile(member)
            files.append((path, handle.read() if handle else b"", (member.mode & 0o777) | 0o600))
    return files, refused


# -- loading -------------------------------------------------------------------------------


def task_folders(source: Path) -> list[Path]:
    """One task (a folder with task.toml) or a dataset (folders of tasks), by name."""
    if (source / "task.toml").is_file():
        return [source]
    if not source.is_dir():
        raise ConfigError(f"{source}: not a Harbor task folder or a dataset of them")
    folders = sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith("."))
    return folders


# Top-level dirs of the host's own that a sandbox without an image (local) keeps: a task's dir
# below one of them is asked for as it is, never the whole top-level dir.
SYSTEM_DIRS = frozenset({"/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc",
                         "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var"})  # fmt: skip


def writable_dirs(paths: list[str]) -> tuple[str, ...]:
    """The dirs a sandbox must let the task write: each path's top-level dir (``/srv`` for
    ``/srv/work``: an adapter makes a new top-level dir, not one inside the host's), or the
    path itself below the host's system dirs."""
    found = set()
    for path in paths:
        normal = posixpath.normpath(path)
        top = "/" + normal.strip("/").split("/")[0]
        if normal == "/" or top == "/tmp":
            continue  # every sandbox's /tmp is its own and writable
        found.add(normal if top in SYSTEM_DIRS else top)
    return tuple(sorted(found))


def spec_for(environment: cfg.Environment, image: str | None, online: bool, *,
             workdir: str | None, also_writable: tuple[str, ...] = (), switch_users: bool = False) -> SandboxSpec:  # fmt: skip
    writable = writable_dirs([*WRITABLE, *([workdir] if workdir else []), *also_writable])
    extra: dict[str, Any] = {}
    if "writable_dirs" in SandboxSpec.__struct_fields__:  # absolute dirs on adapters that have them (local)
        extra["writable_dirs"] = writable
    return SandboxSpec(
        image=image,
        cpu=float(environment.cpus) if environment.cpus else None,
        memory=f"{environment.memory_mb}Mi" if environment.memory_mb else None,
        network="on" if online else "none",
        workdir=workdir,
        env=cfg.resolve_env(environment.env),
        labels={"orchard.recipe": "harbor"},
        pull="never",  # no registry: images are local or built here
        switch_users=switch_users,
        **extra,
    )


def image_for(name: str, folder: Path, environment: cfg.Environment, image_map: dict[str, str], *,
              tests_dir: Path | None = None) -> tuple[str | None, str | None]:  # fmt: skip
    """(image, tag to build) for an environment: its docker_image (mapped), else its
    Dockerfile built as ``images.built_tag``; (None, None) for neither."""
    if environment.docker_image:
        return images.mapped(environment.docker_image, image_map), None
    context = tests_dir if tests_dir is not None and (tests_dir / "Dockerfile").is_file() else folder / "environment"
    if (context / "Dockerfile").is_file():
        tag = images.built_tag(name, context, image_map)
        return tag, tag
    return None, None


def load_task(folder: Path, options: HarborOptions) -> HarborTask:
    """One task folder; ``ConfigError`` (one line, without the folder's name) for what keeps
    it from running anywhere."""
    config = cfg.read_config(folder)
    if not (folder / "instruction.md").is_file() and not config.steps:
        raise ConfigError("no instruction.md")
    if config.environment.os != "linux":
        raise ConfigError(f"os {config.environment.os!r}: only Linux tasks run here")
    if config.environment.mcp_servers:
        raise ConfigError("mcp_servers are not supported")
    if config.environment.gpus:
        raise ConfigError(f"gpus = {config.environment.gpus}: no adapter here gives a sandbox GPUs")
    steps = config.steps
    if steps:
        for step in steps:
            text_path = folder / "steps" / step.name / "instruction.md"
            if not text_path.is_file():
                raise ConfigError(f"step {step.name}: no steps/{step.name}/instruction.md")
            has_test = (folder / "steps" / step.name / "tests" / "test.sh").is_file()
            if not has_test and not (folder / "tests" / "test.sh").is_file():
                raise ConfigError(f"step {step.name}: no tests/test.sh (the step's or the task's)")
        modes = {config.verifier_mode_of(step) for step in steps}
        if len(modes) > 1:
            raise ConfigError("steps mix shared and separate verifiers, which one episode cannot grade")
        instruction = cfg.strip_canary((folder / "steps" / steps[0].name / "instruction.md").read_text())
    else:
        if not (folder / "tests" / "test.sh").is_file():
            raise ConfigError("no tests/test.sh")
        instruction = cfg.strip_canary((folder / "instruction.md").read_text(encoding="utf-8", errors="replace"))
    mode = config.verifier_mode_of(steps[0] if steps else None)
    environment = config.environment
    image, build = image_for(folder.name, folder, environment, options.image_map)
    workdir = environment.workdir
    default_agent = config.agent.timeout_sec or options.agent_timeout
    agent_timeout = sum(s.agent.timeout_sec or default_agent for s in steps) if steps else default_agent
    verifier_timeout = sum((s.verifier.timeout_sec or config.verifier.timeout_sec or 600.0) for s in steps) if steps \
        else (config.verifier.timeout_sec or 600.0)  # fmt: skip
    score_timeout = verifier_timeout + SCORE_MARGIN
    replay = images.replay_plan(folder / "environment")
    first = steps[0] if steps else None
    # One sandbox network for every phase when all are public; else offline at creation and
    # switched per phase (the separate verifier's baseline is its own environment's).
    verifier_env = config.verifier_environment_of(first) or environment
    phases = (environment.network, config.agent_network(first), config.verifier_network(first))
    networks = phase_networks(*phases)
    online = all(n.mode == "public" for n in phases)
    # What a replayed Dockerfile writes outside the workdir must be writable where no image ran.
    replayed = [
        d
        for d in [replay.workdir, *(dest for kind, _, dest in replay.steps if kind == "copy")]
        if d and d.startswith("/")
    ]
    # Users other than root that a phase runs as: the sandbox's root must be able to switch.
    users = {u for u in (config.agent.user, config.verifier.user, *(s.agent.user for s in steps),
                         *(s.verifier.user for s in steps)) if u and str(u) not in ("root", "0")}  # fmt: skip
    common: dict[str, Any] = dict(
        folder=folder,
        config=config,
        instruction=instruction,
        spec=spec_for(
            environment, image, online, workdir=workdir, also_writable=tuple(replayed), switch_users=bool(users)
        ),
        network=networks,
        image_map=dict(options.image_map),
        max_steps=options.max_steps * max(1, len(steps)),
        step_turns=options.max_steps,
        agent_timeout=options.agent_timeout,
        # a multi-step task's earlier steps are verified inside its agent phase
        deadline=SETUP_BUDGET + agent_timeout + (verifier_timeout if steps else 0.0) + score_timeout,
        score_timeout=score_timeout,
        exec_timeout=min(options.exec_timeout, agent_timeout),
        pass_threshold=options.pass_threshold,
        built_image=build,
        replay=replay,
    )
    if mode == "shared":
        return HarborTask(**common)
    # Harbor's precedence: the verifier environment's docker_image, else tests/Dockerfile, else
    # the task's own image.
    tests = folder / "tests"
    if verifier_env is not environment and verifier_env.docker_image:
        verifier_image: str | None = images.mapped(verifier_env.docker_image, options.image_map)
    elif (tests / "Dockerfile").is_file():
        verifier_image = images.built_tag(f"{folder.name}-verifier", tests, options.image_map)
    else:
        verifier_image = image
    scorer = spec_for(verifier_env, verifier_image, online, workdir=verifier_env.workdir, switch_users=bool(users))
    return SeparateHarborTask(**common, scorer_spec=scorer)


def load_tasks(
    source: str = "", options: HarborOptions | Mapping[str, Any] | None = None, **keywords: Any
) -> list[HarborTask]:
    """The tasks of ``--tasks DIR`` (a dataset folder, or one task folder). A folder that
    cannot run is one warning line naming it and why; the rest load. ``ConfigError`` when
    none loads."""
    import warnings

    opts = HarborOptions.resolve(options, **keywords)
    if not source:
        raise ConfigError(
            "the harbor recipe needs --tasks DIR (a Harbor dataset folder, or one task folder) or builtin"
        )
    if source == "builtin":
        source = str(BUILTIN)
    tasks, problems = [], []
    for folder in task_folders(Path(source).expanduser()):
        if opts.ids and folder.name not in opts.ids:
            continue
        try:
            tasks.append(load_task(folder, opts))
        except (ConfigError, OSError, UnicodeDecodeError) as exc:
            problems.append(f"{folder.name}: {exc}")
    for line in problems:
        warnings.warn(f"harbor task skipped: {line}", stacklevel=2)
    if not tasks:
        raise ConfigError(f"no Harbor task in {source} can run" + (f" ({problems[0]})" if problems else ""))
    return tasks


def spec_json(task: HarborTask) -> dict[str, Any]:
    return msgspec.to_builtins(task.spec)
