"""Fixtures for the recipe tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from orchard_async.recipes import swe
from tests.recipes.swe_support import Reply, RunResult, ScriptedChatServer, run_rollout, side_by_side


@pytest.fixture
def chat_server():
    servers: list[ScriptedChatServer] = []

    def start(handler: Callable[[dict[str, Any], int], Reply]) -> ScriptedChatServer:
        server = ScriptedChatServer(handler).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def builtin_validation(tmp_path_factory) -> dict[str, RunResult]:
    """The whole bundled set through the recipe on the local adapter, once per session:
    ``oracle`` (the gold patch, applied by shell commands) and ``empty`` (no change), each
    on its own adapter root so that anything left behind shows."""
    tasks = swe.load_tasks("builtin")
    root = tmp_path_factory.mktemp("swe-validate")

    async def both() -> dict[str, RunResult]:
        return await side_by_side(
            oracle=lambda: run_rollout(tasks, swe.make_policy("oracle"), root / "oracle"),
            empty=lambda: run_rollout(tasks, swe.make_policy("empty"), root / "empty"),
        )

    return anyio.run(both)
