"""The contract in protocols.py, held by the core's own implementations of it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

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


# -- one end verb ---------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# aclose where a third party's protocol names the method, not ours: (file, class) -> whose
THIRD_PARTY_ACLOSE = {
    ("orchard_async/kit/streams.py", "_SandboxSocket"): "httpcore's network stream",
    ("orchard_async/kit/streams.py", "SandboxTransport"): "httpx's transport",
}


def aclose_classes(path: Path) -> set[str]:
    """The classes in a file that define ``async def aclose`` and are not anyio streams (a
    subclass of ``anyio.abc.*``, directly or through a class of the same file)."""
    tree = ast.parse(path.read_text())
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    anyio_streams: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, node in classes.items():
            bases = {ast.unparse(base) for base in node.bases}
            if name not in anyio_streams and any(b.startswith("anyio.abc.") or b in anyio_streams for b in bases):
                anyio_streams.add(name)
                grew = True
    return {
        name
        for name, node in classes.items()
        if name not in anyio_streams
        and any(isinstance(item, ast.AsyncFunctionDef) and item.name == "aclose" for item in node.body)
    }


def test_our_classes_end_with_close_and_aclose_is_left_to_third_party_protocols() -> None:
    found = {
        (str(path.relative_to(ROOT)), name)
        for folder in ("orchard_async", "adapters", "recipes", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if "inside" not in path.parts and "repos" not in path.parts
        for name in aclose_classes(path)
    }
    assert found == set(THIRD_PARTY_ACLOSE)


def test_the_end_verb_check_sees_an_aclose_of_our_own(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import anyio.abc\n"
        "class Stream(anyio.abc.ByteStream):\n    async def aclose(self): ...\n"
        "class Side(Stream):\n    async def aclose(self): ...\n"
        "class Client:\n    async def aclose(self): ...\n"
    )
    assert aclose_classes(tmp_path / "m.py") == {"Client"}


async def test_a_policy_is_closed_by_close_and_one_written_to_aclose_still_is() -> None:
    from orchard_async.apps.cli import close_policy

    closed: list[str] = []

    class Current:
        async def close(self) -> None:
            closed.append("close")

    class Earlier:
        async def aclose(self) -> None:
            closed.append("aclose")

    await close_policy(Current())
    with pytest.warns(DeprecationWarning, match=r"Earlier.aclose\(\).*close\(\)"):
        await close_policy(Earlier())
    await close_policy(object())  # a policy that holds nothing has nothing to close
    assert closed == ["close", "aclose"]
