"""The engine's modules import each other without a cycle: not at module level, not inside a
function, not under ``if TYPE_CHECKING``. The plan decides, the pool and its warm stock serve,
groups and episodes use them, the rollout drives them all; nothing lower reaches back up."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "orchard_async" / "engine"
PACKAGE = "orchard_async.engine"


def engine_imports(folder: Path = ENGINE) -> dict[str, set[str]]:
    """module -> the engine modules it imports anywhere in its file (every kind of import)."""
    modules = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                base = f"{PACKAGE}.{node.module or ''}".rstrip(".") if node.level == 1 else node.module or ""
                for alias in node.names:
                    for target in (f"{base}.{alias.name}", base):
                        if target.startswith(f"{PACKAGE}.") and target.split(".")[2] in modules:
                            found.add(target.split(".")[2])
                            break
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[2] for a in node.names if a.name.startswith(f"{PACKAGE}.")}
        graph[name] = found - {name}
    return graph


def test_the_engine_modules_import_each_other_without_a_cycle() -> None:
    graph = engine_imports()
    assert {"plan", "pool", "warm", "groups", "episode", "rollout"} <= set(graph)
    tuple(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError naming the cycle


def test_the_warm_stock_and_the_plan_stay_below_the_episode() -> None:
    graph = engine_imports()
    assert graph["warm"] == set()  # the pool's stock: nothing else of the engine
    assert "episode" not in graph["plan"] and "groups" not in graph["plan"]


def test_a_cycle_even_under_type_checking_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from orchard_async.engine.b import x\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchard_async.engine.a import y\n"
    )
    graph = engine_imports(tmp_path)
    assert graph == {"a": {"b"}, "b": {"a"}}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("the cycle a <-> b was not found")
