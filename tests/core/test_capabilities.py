"""The contract test: every adapter of the registry (``runtime.ADAPTERS``) and every sandbox
class its ``create`` (and ``attach``) is annotated to return meet ``protocols.Adapter`` /
``protocols.Sandbox`` and each optional capability they declare in ``capabilities``
(``orchard_async.capabilities``): the members present, with the protocol's signature and
async-ness. A member of a capability a class does not declare is an error too, so that
``isinstance(x, Capability)`` answers what the class declares.

The check reads classes, not live objects: no daemon or cluster is needed, and an adapter whose
backend package is not installed is imported with that package stubbed."""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.util
import inspect
import subprocess
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from orchard_async import capabilities, protocols
from orchard_async.capabilities import ADAPTER_CAPABILITIES, SANDBOX_CAPABILITIES, Doctor, FileRoot, Snapshots
from orchard_async.runtime import ADAPTERS

ROOT = Path(__file__).resolve().parents[2]
EMPTY = inspect.Parameter.empty
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


# -- reading a class ---------------------------------------------------------------------------


def protocol_members(protocol: type) -> dict[str, Any]:
    """name -> the protocol's function, or None for a data member."""
    found: dict[str, Any] = {name: None for name in getattr(protocol, "__annotations__", {})}
    for name, value in vars(protocol).items():
        if callable(value) and (not name.startswith("_") or name in ("__aenter__", "__aexit__")):
            found[name] = value
    return found


def instance_attributes(cls: type) -> set[str]:
    """``self.x = ...`` in the methods of ``cls`` and its bases: attributes an instance has
    that the class itself does not show."""
    found: set[str] = set()
    for klass in cls.__mro__:
        for value in vars(klass).values():
            function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if not inspect.isfunction(function):
                continue
            try:
                tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
            except (OSError, TypeError, SyntaxError):  # no source to read: nothing it assigns is seen
                continue
            for node in ast.walk(tree):
                targets = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                    targets = [node.target]
                for target in targets:
                    for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if (
                            isinstance(part, ast.Attribute)
                            and isinstance(part.value, ast.Name)
                            and part.value.id == "self"
                        ):
                            found.add(part.attr)
    return found


def has(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in instance_attributes(cls)


def shape_problems(want: Any, have: Any, where: str) -> list[str]:
    """Why ``have`` cannot stand where the protocol's ``want`` is called (empty: it can)."""
    if isinstance(have, staticmethod | classmethod):
        have = have.__func__
    elif not inspect.isfunction(have):
        return [f"{where} is {type(have).__name__}, not a method"]
    if inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(have):
        return [f"{where} must {'' if inspect.iscoroutinefunction(want) else 'not '}be async def"]
    wanted = list(inspect.signature(want).parameters.values())[1:]  # without self
    given = list(inspect.signature(have).parameters.values())[1:]
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in given)
    takes_any_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in given)
    by_name = {p.name: p for p in given}
    problems, matched = [], set()
    for index, param in enumerate(wanted):
        if param.kind is inspect.Parameter.VAR_POSITIONAL:  # `*exc` of __aexit__: any positional parameters will do
            matched.update(p.name for p in given if p.kind in POSITIONAL or p.kind is param.kind)
            continue
        if param.kind in POSITIONAL:
            same = given[index] if index < len(given) else None
            if same is None or same.name != param.name or same.kind not in POSITIONAL:
                if not (takes_any_positional and takes_any_keyword):
                    problems.append(f"{where} needs {param.name!r} as its parameter {index + 1}")
                continue
        else:
            same = by_name.get(param.name)
            if same is None or same.kind not in (inspect.Parameter.KEYWORD_ONLY, *POSITIONAL):
                if not takes_any_keyword:
                    problems.append(f"{where} takes no keyword {param.name!r}")
                continue
        matched.add(same.name)
        if param.default is not EMPTY and same.default is EMPTY:
            problems.append(f"{where}: {param.name!r} needs a default ({param.default!r})")
        elif param.default is not EMPTY and same.default != param.default:
            problems.append(f"{where}: {param.name!r} defaults to {same.default!r}, the contract to {param.default!r}")
    for param in given:
        if param.name not in matched and param.kind in (*POSITIONAL, inspect.Parameter.KEYWORD_ONLY):
            if param.default is EMPTY:
                problems.append(f"{where} requires {param.name!r}, which the contract does not pass")
    return problems


def meets(cls: type, protocol: type) -> list[str]:
    problems = []
    for name, want in protocol_members(protocol).items():
        where = f"{cls.__name__}.{name}"
        if not has(cls, name):
            problems.append(f"{cls.__name__} lacks {name} ({protocol.__name__})")
        elif want is not None and not hasattr(cls, name):
            problems.append(f"{where} is set on each instance, not a method of the class")
        elif want is not None:
            problems += shape_problems(want, inspect.getattr_static(cls, name), where)
    return problems


def contract_problems(cls: type, mandatory: type, optional: tuple[type, ...]) -> list[str]:
    """What keeps ``cls`` from its contract: ``mandatory``, and each of ``optional`` that it
    declares in ``capabilities``; a member of an undeclared one is a problem too."""
    declared = getattr(cls, "capabilities", frozenset())
    problems = [
        f"{cls.__name__} declares {c!r}, not one of {[o.__name__ for o in optional]}" for c in declared - set(optional)
    ]
    problems += meets(cls, mandatory)
    for capability in optional:
        if capability in declared:
            problems += meets(cls, capability)
            continue
        present = sorted(name for name in protocol_members(capability) if has(cls, name))
        if present:
            problems.append(f"{cls.__name__} has {', '.join(present)} but does not declare {capability.__name__}")
    return problems


def sandbox_classes(adapter: type) -> list[type]:
    """The sandbox classes an adapter makes: what its ``create`` (and ``attach``) return, by
    their annotations; the protocol itself names no class and is a problem of its own."""
    found: list[type] = []
    for method in ("create", "attach"):
        if hasattr(adapter, method):
            returned = typing.get_type_hints(getattr(adapter, method))["return"]
            for member in typing.get_args(returned) or (returned,):
                if member not in found:
                    found.append(member)
    return found


def adapter_problems(adapter: type) -> list[str]:
    problems = contract_problems(adapter, protocols.Adapter, ADAPTER_CAPABILITIES)
    for sandbox in sandbox_classes(adapter):
        if sandbox is protocols.Sandbox or not isinstance(sandbox, type):
            problems.append(f"{adapter.__name__}.create must be annotated with its sandbox class, not {sandbox!r}")
            continue
        problems += contract_problems(sandbox, protocols.Sandbox, SANDBOX_CAPABILITIES)
    return problems


# -- importing an adapter whose backend is not installed -------------------------------------


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return stub(name)


def stub(name: str) -> type:
    """Anything a missing package's module gives at import time: a class, whose attributes are
    classes too (module-level code names them, subclasses them, puts them in tuples)."""
    return _StubMeta(name, (), {"__init__": lambda self, *args, **kwargs: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, packages: set[str]):
        self.packages = packages

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.partition(".")[0] in self.packages:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return stub(name)

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def restored_modules() -> Iterator[None]:
    """Every module imported meanwhile is forgotten again: a stub must not stand in for a
    package later (nor a module imported over stubs)."""
    before = dict(sys.modules)
    try:
        yield
    finally:
        for name in set(sys.modules) - set(before):
            del sys.modules[name]
        sys.modules.update(before)


def adapter_class(name: str) -> type:
    """The registry's class for ``name``; a third-party package it needs that is missing is
    stubbed (the class is read, never run)."""
    module_name, _, class_name = ADAPTERS[name].partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.startswith("orchard_async"):
            raise
    missing: set[str] = set()
    with restored_modules():
        finder = _StubFinder(missing)
        sys.meta_path.insert(0, finder)
        try:
            for _ in range(10):
                try:
                    return getattr(importlib.import_module(module_name), class_name)
                except ModuleNotFoundError as exc:
                    if not exc.name or exc.name.startswith("orchard_async") or exc.name in missing:
                        raise
                    missing.add(exc.name.partition(".")[0])
                    for loaded in [m for m in sys.modules if m.partition(".")[0] in missing or sys.modules[m] is None]:
                        del sys.modules[loaded]
            raise AssertionError(f"{name}: still missing packages after stubbing {sorted(missing)}")
        finally:
            sys.meta_path.remove(finder)


# -- the registry --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_every_registered_adapter_and_its_sandboxes_meet_the_contract_they_declare(name: str) -> None:
    adapter = adapter_class(name)
    assert adapter.name == name
    assert adapter_problems(adapter) == []


def test_an_adapter_whose_backend_package_is_missing_is_still_checked() -> None:
    """In a fresh interpreter where aiodocker and kubernetes_asyncio cannot be imported; the
    stubs are gone afterwards (the packages are as missing as before)."""
    script = (
        "import sys; sys.modules['aiodocker'] = sys.modules['kubernetes_asyncio'] = None\n"
        "from tests.core.test_capabilities import adapter_class, adapter_problems\n"
        "for name in ('docker', 'kubernetes'):\n"
        "    adapter = adapter_class(name)\n"
        "    print(name, adapter.__name__, adapter_problems(adapter), sys.modules['aiodocker'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["docker DockerAdapter [] None", "kubernetes KubernetesAdapter [] None"]


# -- the check itself fails where it must ------------------------------------------------------


class GoodAdapter:
    name = "good"
    capabilities = frozenset({Snapshots, Doctor})

    async def create(self, spec: Any) -> GoodSandbox: ...
    async def list_owned(self) -> list[str]: ...
    async def reap(self, older_than: float = 0.0) -> list[str]: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> GoodAdapter: ...
    async def __aexit__(self, *exc: object) -> None: ...
    async def snapshot(self, sandbox: Any) -> str: ...
    async def drop_snapshot(self, snapshot_id: str) -> None: ...
    async def doctor(self) -> str: ...


class GoodSandbox:
    capabilities = frozenset({FileRoot})
    workdir = "/"

    def __init__(self) -> None:
        self.id, self.labels = "s", {}
        self.root = "/"

    async def exec(self, cmd: str, *, timeout: float | None = 600.0, cwd: str | None = None, **more: Any) -> Any: ...
    async def read_file(self, path: str) -> bytes: ...
    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None: ...
    async def list_dir(self, path: str = ".") -> list[Any]: ...
    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> Any: ...
    def session(self) -> AbstractAsyncContextManager[Any]: ...
    async def open_stream(self, argv: Any) -> Any: ...
    async def connect(self, port: int) -> Any: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> GoodSandbox: ...
    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


def variant(base: type, **changes: Any) -> type:
    """``base`` with members replaced (a value) or taken away (None)."""
    body = {
        name: value
        for name, value in vars(base).items()
        if name not in ("__dict__", "__weakref__") and (name not in changes or changes[name] is not None)
    }
    body.update({name: value for name, value in changes.items() if value is not None})
    return type(base.__name__, (), body)


async def _anything(self: Any, *args: Any) -> Any: ...


def test_the_well_formed_examples_pass() -> None:
    assert adapter_problems(GoodAdapter) == []


@pytest.mark.parametrize(
    ("cls", "changes", "expected"),
    [
        (GoodAdapter, {"drop_snapshot": None}, "GoodAdapter lacks drop_snapshot (Snapshots)"),
        (GoodAdapter, {"doctor": lambda self: "ready"}, "GoodAdapter.doctor must be async def"),
        (GoodAdapter, {"snapshot": lambda self, box: ""}, "GoodAdapter.snapshot must be async def"),
        (GoodAdapter, {"capabilities": frozenset({Snapshots})}, "GoodAdapter has doctor but does not declare Doctor"),
        (GoodAdapter, {"reap": _anything}, "GoodAdapter.reap needs 'older_than' as its parameter 1"),
        (GoodAdapter, {"name": None}, "GoodAdapter lacks name (Adapter)"),
        (GoodSandbox, {"open_stream": None, "connect": None}, "GoodSandbox lacks open_stream (Sandbox)"),
        (GoodSandbox, {"capabilities": frozenset()}, "GoodSandbox has root but does not declare FileRoot"),
        (GoodSandbox, {"capabilities": frozenset({capabilities.Ping, FileRoot})}, "GoodSandbox lacks ping (Ping)"),
        (GoodSandbox, {"capabilities": frozenset({Doctor, FileRoot})}, "GoodSandbox declares"),
    ],
)
def test_a_missing_or_misshapen_member_is_caught(cls: type, changes: dict[str, Any], expected: str) -> None:
    mandatory, optional = (
        (protocols.Adapter, ADAPTER_CAPABILITIES) if cls is GoodAdapter else (protocols.Sandbox, SANDBOX_CAPABILITIES)
    )
    assert contract_problems(cls, mandatory, optional) == []
    problems = contract_problems(variant(cls, **changes), mandatory, optional)
    assert any(problem.startswith(expected) for problem in problems), problems


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("async def exec(self, cmd, *, timeout=600.0, cwd=None, env=None): ...", "takes no keyword 'stdin'"),
        ("async def exec(self, cmd, *, timeout=30.0, cwd=None, env=None, stdin=None): ...", "defaults to 30.0"),
        ("async def exec(self, cmd, *, timeout, cwd=None, env=None, stdin=None): ...", "needs a default"),
        ("async def exec(self, command, **options): ...", "needs 'cmd' as its parameter 1"),
        ("async def exec(self, cmd, user, **options): ...", "requires 'user'"),
        ("def exec(self, cmd, **options): ...", "must be async def"),
    ],
)
def test_a_wrong_signature_is_caught(method: str, expected: str) -> None:
    namespace: dict[str, Any] = {}
    exec(method, namespace)  # noqa: S102 - the method under test, written as it would be in a class
    problems = shape_problems(protocols.Sandbox.exec, namespace["exec"], "X.exec")
    assert any(expected in problem for problem in problems), problems
    assert shape_problems(protocols.Sandbox.exec, GoodSandbox.exec, "GoodSandbox.exec") == []


def test_isinstance_answers_what_a_registered_class_declares() -> None:
    """What the callers rely on: an undeclared capability is absent, a declared one present."""
    from orchard_async.adapters.sim import SimAdapter

    sim = SimAdapter()
    assert not isinstance(sim, Snapshots) and not isinstance(sim, Doctor)
    assert capabilities.facts_of(sim) == capabilities.AdapterFacts(runs_commands=False)
    assert capabilities.facts_of(object()) == capabilities.AdapterFacts()  # an adapter that states none
