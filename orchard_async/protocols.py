"""The whole contract on one screen: what an adapter, a task, a policy and a recipe provide.

Backends implement ``Adapter`` and ``Sandbox`` (and ``Session``); recipes provide ``Task``s
(optionally ``GradedApart``) and ``Policy``s, and register as a ``Recipe`` module. Nothing
else is asked of them. What a backend may offer besides (forks, taking over sandboxes, a
doctor line, a ping, its facts) are the optional capabilities in ``capabilities``, each
declared by the class that offers it. The plain data they exchange is in ``types``
(``SandboxSpec``, ``ExecResult``), ``task`` (``Reward``, ``Observation``) and ``trajectory``
(``Action``).

Command timeouts (``timeout=`` of ``Sandbox.exec`` and ``Session.exec``), one meaning for
every adapter:

* a number: seconds until the command's whole process group is killed; the result then
  has ``reason == ExitReason.TIMEOUT``;
* left out: ``DEFAULT_EXEC_TIMEOUT`` (600 s), so a forgotten timeout never pins a sandbox;
* ``None``: no limit of its own; the command runs until it exits or the sandbox ends (its
  TTL, or its loss: ``ExitReason.SANDBOX_LOST``).

A value that is not a positive number is a ``ConfigError``. The same three meanings hold
for every exec-like call of every adapter; ``Task.exec_timeout`` is a number.

Lifetimes, one verb each:

* a sandbox ends in one way: ``await sandbox.close()``, or leaving ``async with sandbox``.
  Closing is idempotent, shielded from the caller's cancellation, and does not raise for
  a sandbox that is already gone; it removes the sandbox and everything it runs. (The pool
  closes the sandboxes it hands out with ``Pool.close_sandbox``: the same close, plus its
  count of live sandboxes.)
* an adapter is held as ``async with get_adapter(...) as adapter`` (or closed with
  ``await adapter.close()`` by a caller that cannot hold it in a block). Its background
  work (stream readers, heartbeats, a pod watch) runs in its own anyio task group
  (``orchard_async.kit.background``); closing it closes every sandbox it still has, cancels
  that work and waits for it.

Forks (optional, for adapters that can): ``capabilities.Snapshots``.

Create timeout: the caller owns it (the ``Pool``'s ``create_timeout``, 120 s by default),
as a cancel scope around ``Adapter.create``. An adapter has no create timeout of its own;
one that can say why a create is slow reads the caller's deadline
(``kit.deadline.explained_deadline``) and raises its own ``CreateFailed`` a little before it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orchard_async.types import ExecResult, FileInfo, SandboxSpec

if TYPE_CHECKING:
    import anyio.abc

    from orchard_async.records.trajectory import Action
    from orchard_async.task import Observation, Reward

DEFAULT_EXEC_TIMEOUT = 600.0  # seconds: a command's limit when the caller names none (see above)
# A shell adapter's self-destruct timer (its TTL) is a process inside the sandbox with this word
# as an argument of its argv (its shell's $0), and every process it starts is its child: what
# a task that ends "every process the agent left" (Harbor's shared verifier) must spare.
TIMER_NAME = "orchard-timer"


# -- backends -----------------------------------------------------------------------------


@runtime_checkable
class Session(Protocol):
    """A stateful shell: working directory and variables carry over between commands."""

    async def exec(
        self, cmd: str, *, timeout: float | None = DEFAULT_EXEC_TIMEOUT, stdin: bytes | None = None
    ) -> ExecResult: ...


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine. A command's failure is an ``ExecResult`` (its ``reason`` says
    why), never an exception; a sandbox that died answers ``ExitReason.SANDBOX_LOST``."""

    id: str
    workdir: str
    labels: dict[str, str]

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None: ...

    async def list_dir(self, path: str = ".") -> list[FileInfo]: ...

    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> ExecResult: ...

    def session(self) -> AbstractAsyncContextManager[Session]: ...

    async def open_stream(self, argv: Sequence[str]) -> anyio.abc.ByteStream:
        """Start ``argv`` inside the sandbox (its namespaces, its limits, its network, its
        working directory) and return a byte stream over the process's stdin and stdout: one
        process for the whole conversation, not a command per message (local: two FIFOs;
        docker: one exec attach; kubernetes: one exec websocket). Use it as
        ``async with await sandbox.open_stream([...]) as stream``; closing it kills the
        process and everything it started. The stream has ``pid`` (as the sandbox sees it).
        ``FileNotFoundError`` when the program is not in the sandbox; ``SandboxLost`` when the
        sandbox is gone; ``ConfigError`` on an adapter without processes (sim)."""
        ...

    async def connect(self, port: int) -> anyio.abc.ByteStream:
        """A TCP connection to ``127.0.0.1:port`` inside the sandbox, over ``open_stream``
        (a relay process in the sandbox: its ``python3``, else busybox ``nc``); the sandbox's
        network stays as its spec says. ``ConnectionRefusedError`` when nothing listens
        there. On top: ``orchard_async.SandboxTransport`` (httpx) and
        ``orchard_async.forward`` (a port on the controller's loopback)."""
        ...

    async def close(self) -> None:
        """End the sandbox: the one way (see the module docstring)."""
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxRecord(Protocol):
    """What ``list_owned``/``reap`` see: enough to identify and remove a sandbox."""

    id: str
    labels: dict[str, str]


@runtime_checkable
class Adapter(Protocol):
    """A backend connection that makes sandboxes. Found by name with ``get_adapter``.

    Optional (``capabilities``): ``Doctor`` (``orchard-async doctor``'s line), ``Snapshots``
    (forks), ``Reattach`` (taking over sandboxes another controller made), ``Facts``.

    A sandbox it made is ended by ``sandbox.close()``; the adapter itself by leaving
    ``async with adapter`` or by ``close()`` (see the module docstring)."""

    name: str

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """A new sandbox, ready for commands. ``CreateFailed`` or ``BackendUnavailable``
        when the backend could not make it (retried by the engine); ``ConfigError`` when
        the spec is at fault. Bounded by the caller's deadline (the pool's create timeout)."""
        ...

    async def list_owned(self) -> list[str]:
        """Ids of live sandboxes this adapter instance created and that are not yet gone
        (closed, but the backend did not confirm the removal, counts as not gone)."""
        ...

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Remove sandboxes of dead or expired runs (any process's); return their ids."""
        ...

    async def close(self) -> None:
        """Close every sandbox it still has, stop its background work, drop its connections.
        The adapter may be used again afterwards."""
        ...

    async def __aenter__(self) -> Adapter: ...

    async def __aexit__(self, *exc: object) -> None:
        """``close()``, and the end of the adapter's task group."""
        ...


# -- tasks and policies ---------------------------------------------------------------------


@runtime_checkable
class Task(Protocol):
    """One problem. ``deadline`` bounds the whole episode; ``score_timeout`` of it is kept
    for scoring, so the sandbox never dies before its verifier runs.

    A task scores in one of two ways: ``evaluate(sandbox)`` judges the agent's own sandbox
    (fine for toy chores), or, as ``GradedApart``, ``submission`` + ``grade`` judge the
    agent's output in a clean sandbox (what any reward a policy could learn to forge needs).

    Optional: ``parse_failure_limit: int``: that many policy replies in a row that are not
    actions (``Action(kind="invalid")``) end the episode as ``parse_failures`` (absent or
    0: no limit; each is a step the policy is told about).
    """

    id: str
    spec: SandboxSpec
    max_steps: int
    deadline: float
    score_timeout: float
    exec_timeout: float

    async def setup(self, sandbox: Sandbox) -> str:
        """Prepare the sandbox; return the instruction the agent sees."""
        ...

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        """The verdict on the agent's sandbox as it was left (not called for GradedApart tasks)."""
        ...


@runtime_checkable
class GradedApart(Protocol):
    """A task whose verdict the agent cannot touch. ``submission`` reads what the agent
    produced out of its sandbox (a patch, an answer): the only thing that crosses over.
    The agent's sandbox is then destroyed, with whatever it left running, and ``grade``
    judges the submission in a fresh sandbox of the same spec. The episode loop prefers
    this over ``evaluate`` whenever a task has both."""

    async def submission(self, sandbox: Sandbox) -> str: ...

    async def grade(self, submission: str, sandbox: Sandbox) -> Reward: ...


@runtime_checkable
class Policy(Protocol):
    """Decides the next action from what the episode has seen so far.

    ``act`` raising ``ModelUnavailable`` (an ``InfraError``) has the episode retried;
    ``ContextExhausted`` ends it and scores what the agent left; any other exception ends
    it as ``policy_error``.

    Optional: ``async def close(self) -> None``, for a policy that holds resources (a
    model policy's HTTP client). Whoever made the policy calls it once when done with it
    (the CLI does, after the run); the rollout engine never does, since one policy serves
    every episode. (A policy written when this was ``aclose`` is still closed by the CLI,
    with a DeprecationWarning.)

    Optional: ``def episode_ended(self, episode_id: str) -> None``, for a policy that keeps
    something per episode (a harness run's calls, screenshots, a token context). The engine
    calls it once an attempt at the episode is over, however it ended (a submit, its step
    budget, its deadline, an error, an abort), so that state goes with the episode instead
    of staying for the rest of the run. It must not raise and should not block."""

    name: str

    async def act(self, observation: Observation) -> Action: ...


def tell_episode_ended(policy: object, episode_id: str) -> None:
    """Call ``policy``'s optional ``episode_ended`` (see ``Policy``), if it has one: what the
    engine does once an attempt is over, and what a policy that wraps others does for them."""
    ended = getattr(policy, "episode_ended", None)
    if ended is not None:
        ended(episode_id)


# -- recipes -----------------------------------------------------------------------------


class Recipe(Protocol):
    """What a recipe module provides. A recipe registers under the ``orchard_async.recipes``
    entry-point group (name = the recipe's name, value = the module), and the CLI imports
    it only when a command uses it (``load_recipe``)::

        [project.entry-points."orchard_async.recipes"]
        swe = "orchard_async.recipes.swe"

    * ``load_tasks(source, options=None)``: the tasks for ``--tasks SOURCE`` (``"builtin"``
      by default); a source it does not know is a ``ConfigError``.
    * ``make_policy(name, options=None)``: the policy for ``--policy NAME``; an unknown one is
      a ``ConfigError``.
    * ``POLICIES``: the policy names ``make_policy`` takes.
    * optional ``OPTIONS``: its options, a ``RecipeOptions`` struct (``--recipe-options JSON``).
      Both functions take ``options``: the struct, or a mapping of its fields (keywords too),
      checked against it; an ``ORCHARD_*`` variable is only an option's default. A recipe
      without ``OPTIONS`` takes none and is called without ``options``.
    * optional ``IMAGES``: the ``ImageSpec``s of the images its sandboxes run
      (``orchard-async images build`` builds them).

    A recipe's own commands register under ``orchard_async.commands`` (name = the command,
    value = a function ``add_command(parser: argparse.ArgumentParser) -> None`` that adds
    the command's arguments and sets ``func``, called with the parsed arguments and
    returning the exit status). The CLI lists the name in ``--help`` without importing
    anything, and imports the function only when that command runs::

        [project.entry-points."orchard_async.commands"]
        export-gui = "orchard_async.recipes.gui.cli:add_export_command"
    """

    POLICIES: Collection[str]

    def load_tasks(self, source: str, options: Any = None) -> Sequence[Task]: ...

    def make_policy(self, name: str, options: Any = None) -> Policy: ...
