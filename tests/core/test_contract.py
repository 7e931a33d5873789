"""The contract in protocols.py, held by the core's own implementations of it."""

from __future__ import annotations

import inspect

import orchard_async as oa
from orchard_async.engine.recording import RecordingSandbox
from orchard_async.kit.sandbox import ShellSandbox, ShellSession


def test_a_shell_sandbox_takes_the_contracts_default_command_timeout() -> None:
    """Left out, a command's timeout is DEFAULT_EXEC_TIMEOUT, for a sandbox and a session alike
    (every adapter with a shell: local, docker, kubernetes)."""
    for method in (ShellSandbox.exec, ShellSession.exec, oa.Sandbox.exec, oa.Session.exec):
        assert inspect.signature(method).parameters["timeout"].default == oa.DEFAULT_EXEC_TIMEOUT, method


def test_the_bundled_recipes_and_policies_have_the_contracts_shape() -> None:
    for name in oa.recipe_names():
        recipe = oa.load_recipe(name)
        assert callable(recipe.load_tasks) and callable(recipe.make_policy) and recipe.POLICIES, name
        policy = recipe.make_policy("oracle")
        assert isinstance(policy, oa.Policy)
        task = recipe.load_tasks("builtin")[0]
        assert isinstance(task, oa.Task)
    swe_task = oa.load_recipe("swe").load_tasks("builtin")[0]
    assert isinstance(swe_task, oa.GradedApart)  # its verdict comes from a clean sandbox


def test_the_sandbox_a_task_and_a_policy_see_in_an_episode_is_a_whole_sandbox() -> None:
    """Every method of the contract, streams included, reaches the adapter's sandbox through
    the episode's recording wrapper."""
    members = {name for name in dir(oa.Sandbox) if not name.startswith("_")} - {"id", "workdir", "labels"}
    missing = {name for name in members if not callable(getattr(RecordingSandbox, name, None))}
    assert not missing


async def test_a_stream_through_the_recording_wrapper_is_timed(tmp_path) -> None:
    adapter = oa.get_adapter("local", root=str(tmp_path / "root"))
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    ops: list = []
    try:
        recorded = RecordingSandbox(box, ops, 0.0)
        async with await recorded.open_stream(["cat"]) as stream:
            await stream.send(b"ping\n")
            assert await stream.receive() == b"ping\n"
        assert [op.name for op in ops] == ["open_stream"]
    finally:
        await adapter.close()
