"""The contract in protocols.py, held by the core's own implementations of it."""

from __future__ import annotations

import inspect

import orchard_async as oa
from orchard_async.sandbox import ShellSandbox, ShellSession


def test_a_shell_sandbox_takes_the_contracts_default_command_timeout() -> None:
    """Left out, a command's timeout is DEFAULT_EXEC_TIMEOUT, for a sandbox and a session alike
    (every adapter with a shell: local, docker, kubernetes)."""
    for method in (ShellSandbox.exec, ShellSession.exec, oa.Sandbox.exec, oa.Session.exec):
        assert inspect.signature(method).parameters["timeout"].default == oa.DEFAULT_EXEC_TIMEOUT, method


def test_the_bundled_recipes_and_policies_have_the_contracts_shape() -> None:
    for name in ("toy", "swe"):
        recipe = oa.load_recipe(name)
        assert callable(recipe.load_tasks) and callable(recipe.make_policy) and recipe.POLICIES, name
        policy = recipe.make_policy("oracle")
        assert isinstance(policy, oa.Policy)
        task = recipe.load_tasks("builtin")[0]
        assert isinstance(task, oa.Task)
    swe_task = oa.load_recipe("swe").load_tasks("builtin")[0]
    assert isinstance(swe_task, oa.GradedApart)  # its verdict comes from a clean sandbox
