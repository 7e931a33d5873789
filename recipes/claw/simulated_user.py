"""The simulated user played by a language model (multi-turn tasks), on the controller's side.

    orchard-async run claw --tasks builtin --policy oracle \\
      --recipe-options '{"user_base_url": "http://my-vllm:8000/v1", "user_model": "my-user-model"}' ...

(or ``ORCHARD_CLAW_USER_BASE_URL`` and ``ORCHARD_CLAW_USER_MODEL``, their defaults). Without
them the task's script answers (as in the tests). With them, every task
that has a ``user`` gets, for each episode, a recording proxy (``orchard_async.models.proxy``)
with a session of the user's own, relayed onto the agent sandbox's loopback over one stream
(network stays off), the path a harness's model calls take. The services' ``user.ask`` calls
it (``sandbox/claw_user.py``), the script's rules grounding the model; the recorded calls land
in the episode's ``info.simulated_user``.

The relay has to live from ``setup`` to ``submission``, which the episode loop runs in one
task but on either side of the agent phase's cancel scope: it runs in a task of its own
(asyncio), stopped at submission or, if the episode never gets there, at the task's deadline.

A model that cannot answer makes the episode fail as ``model_unavailable`` (an
``InfraError``: retried, never scored).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from orchard_async import ConfigError, ModelUnavailable, Sandbox
from orchard_async.models.proxy import ModelCall, ModelProxy, Upstream, serve_into

if TYPE_CHECKING:
    from orchard_async.recipes.claw.task import ClawOptions

MAX_CALLS = 50  # per episode: far above any task's max_rounds, a bound on a runaway loop
DEADLINE_MARGIN = 60.0  # seconds past the task's deadline an orphaned relay may live


@dataclass
class UserLink:
    """One episode's connection to the user model: what the sandbox's services get, and the
    relay's task."""

    url: str
    key: str
    model: str
    stop: asyncio.Event
    runner: asyncio.Task
    calls: list[ModelCall] = field(default_factory=list)

    def config(self, goal: str) -> dict[str, Any]:
        return {"url": self.url, "key": self.key, "model": self.model, "goal": goal}


@dataclass
class UserModel:
    """Where the simulated user's model is (``base_url`` ends in ``/v1``)."""

    upstream: Upstream

    @classmethod
    def from_options(cls, options: ClawOptions) -> UserModel | None:
        """The user model the recipe's ``user_*`` options name; None when they name none."""
        if not options.user_base_url:
            return None
        if not options.user_model:
            raise ConfigError(
                "the claw recipe's user_base_url is set: set user_model too (the model that plays the user; "
                "ORCHARD_CLAW_USER_MODEL)"
            )
        return cls(Upstream(options.user_base_url, options.user_api_key or None, options.user_model))

    async def attach(self, sandbox: Sandbox, label: str, *, lifetime: float) -> UserLink:
        """Start the episode's proxy session and its relay into ``sandbox``."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigError("the LLM simulated user needs the asyncio event loop (anyio's default)") from None
        ready: asyncio.Future[tuple[int, str]] = loop.create_future()
        stop = asyncio.Event()
        calls: list[ModelCall] = []
        runner = loop.create_task(self._relay(sandbox, label, lifetime, ready, stop, calls))
        try:
            port, key = await ready
        except BaseException:
            runner.cancel()
            raise
        link = UserLink(f"http://127.0.0.1:{port}/v1", key, self.upstream.model or "user", stop, runner, calls)
        return link

    async def _relay(
        self,
        sandbox: Sandbox,
        label: str,
        lifetime: float,
        ready: asyncio.Future[tuple[int, str]],
        stop: asyncio.Event,
        calls: list[ModelCall],
    ) -> None:
        try:
            async with ModelProxy(self.upstream) as proxy:
                session = proxy.open_session(label + ":user", max_calls=MAX_CALLS)
                try:
                    async with serve_into(sandbox, proxy.port) as port:
                        ready.set_result((port, session.key))
                        with anyio.move_on_after(lifetime):
                            await stop.wait()
                finally:
                    calls.extend(proxy.close_session(session))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(repr(exc)))
            if not isinstance(exc, Exception):
                raise

    @staticmethod
    async def detach(link: UserLink) -> list[ModelCall]:
        """Stop the relay; the calls the user model answered, in order."""
        link.stop.set()
        try:
            await link.runner
        except Exception:  # the relay's own failure: whatever it recorded still counts
            pass
        return link.calls


def check_user_turns(world: dict[str, Any], calls: list[ModelCall]) -> None:
    """Raise ``ModelUnavailable`` when the user model failed a turn of this episode."""
    failure = (world.get("user") or {}).get("model_failure")
    if failure:
        statuses = sorted({call.status for call in calls})
        raise ModelUnavailable(f"the simulated user's model failed: {failure} (proxy statuses {statuses})")


def calls_info(calls: list[ModelCall]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(call) for call in calls]
