"""The floor plan as a test: which layer may import which (docs/architecture.md states the rules).

Every module of the ``orchard_async`` namespace (the core's folders and the top-level
``adapters/``, ``recipes/``, ``bench/``) is read with ``ast``; each import is resolved to a module
and checked against the rules of the importing module's layer. Module-level imports must follow
the rules; an import inside a function (run only when called) may reach up to the registry,
adapters and recipes (the plugin points, named as strings or loaded on use) but never into the
apps or bench; ``if TYPE_CHECKING:`` imports never run and are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "orchard_async": ROOT / "orchard_async",
    "orchard_async.adapters": ROOT / "adapters",
    "orchard_async.recipes": ROOT / "recipes",
    "orchard_async.bench": ROOT / "bench",
}
CONTRACT = {
    "orchard_async.protocols",
    "orchard_async.capabilities",
    "orchard_async.types",
    "orchard_async.errors",
    "orchard_async.task",
}
BOOTSTRAP = "orchard_async._checkout"  # imports nothing of ours; makes a checkout import from itself

# layer -> the layers its module-level imports may reach (its own always included)
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "kit": {"contract"},
    "records": {"contract"},
    "models": {"contract", "kit", "records"},
    "images": {"contract"},
    "engine": {"contract", "kit", "records", "models"},
    "registry": {"contract"},
    "public": {"contract", "kit", "records", "engine", "registry"},
    "adapters": {"contract", "kit", "images"},
    "recipes": {"public", "contract", "records", "models", "images"},
    "apps": {"public", "contract", "kit", "records", "models", "images", "engine", "registry", "adapters"},
    "bench": {"public", "contract", "kit", "records", "models", "adapters", "recipes", "apps"},
    # orchard_async/openenv.py: OpenEnv's ContainerProvider over the public API (sandbox.expose)
    "openenv": {"public", "contract", "kit", "registry"},
    # The Harbor environment provider (orchard_async.harbor): Harbor's runner drives an adapter
    # from the registry, with the Harbor recipe's images and task rules; nothing imports it.
    "harbor": {"public", "contract", "registry", "recipes"},
}
LAZY_EXTRA = {"registry", "adapters", "recipes", "public"}  # plugin points, imported when used
NEVER_LAZY = {"apps", "bench"}  # nothing in the layers reaches the applications


def layer_of(module: str) -> str:
    if module == "orchard_async":
        return "public"
    if module in CONTRACT or module == BOOTSTRAP:
        return "contract"
    if module == "orchard_async.runtime":
        return "registry"
    part = module.split(".")[1]
    return part if part in ALLOWED else f"unknown:{part}"


def modules() -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "inside" in parts or "repos" in parts or (package == "orchard_async" and parts[0] in FOLDERS_INSIDE):
                continue  # files that run inside a sandbox, and tasks' own repositories
            is_package = parts[-1] == "__init__"
            name = ".".join([package, *(parts[:-1] if is_package else parts)])
            found[name] = (path, is_package)
    return found


FOLDERS_INSIDE = {"adapters", "recipes", "bench"}  # not folders of orchard_async/: they are mapped above


def imports(module: str, path: Path, is_package: bool, known: set[str]) -> list[tuple[str, str, int]]:
    """(target module, "module"|"lazy", line) for every import of the namespace in one file."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, str, int]] = []

    def target(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base) + (f".{node.module}" if node.module else "")

    def visit(node: ast.AST, when: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                for orelse in child.orelse:
                    visit(orelse, when)
                continue
            inner = "lazy" if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else when
            if isinstance(child, ast.Import):
                found.extend((a.name, when, child.lineno) for a in child.names if a.name.startswith("orchard_async"))
            elif isinstance(child, ast.ImportFrom):
                base = target(child)
                if base.startswith("orchard_async"):
                    for alias in child.names:
                        name = f"{base}.{alias.name}"
                        found.append((name if name in known else base, when, child.lineno))
            visit(child, inner)

    visit(tree, "module")
    return found


def family(module: str) -> str:
    """What a module belongs to within its layer: one adapter (local's satellite modules are
    ``local_*``), one recipe, or the layer itself."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in {"adapters", "recipes"}:
        return parts[2].split("_")[0] if parts[1] == "adapters" else parts[2]
    return ""


def violations(module: str, imported: list[tuple[str, str, int]]) -> list[str]:
    layer = layer_of(module)
    wrong = []
    for target, when, line in imported:
        if target == module or target.startswith(module + "."):
            continue
        to = layer_of(target)
        allowed = ALLOWED.get(layer, set()) | {layer}
        if when == "lazy":
            allowed = (allowed | LAZY_EXTRA) - (NEVER_LAZY - {layer} - ALLOWED.get(layer, set()))
        ok = to in allowed
        if ok and layer == to and layer in {"adapters", "recipes"}:
            ok = family(module) == family(target) or target in {"orchard_async.adapters", "orchard_async.recipes"}
        if not ok:
            wrong.append(f"{module}:{line} ({layer}) imports {target} ({to}) at {when} level")
    return wrong


def all_violations() -> list[str]:
    found = modules()
    known = set(found)
    wrong = []
    for module, (path, is_package) in sorted(found.items()):
        wrong += violations(module, imports(module, path, is_package, known))
    return wrong


def test_every_module_is_in_a_known_layer() -> None:
    assert sorted({layer_of(m) for m in modules()} - set(ALLOWED)) == []


def test_the_layers_import_only_what_the_architecture_page_allows() -> None:
    assert all_violations() == []


@pytest.mark.parametrize(
    ("module", "target", "when"),
    [
        ("orchard_async.protocols", "orchard_async.engine.rollout", "module"),  # the contract reaching up
        ("orchard_async.kit.shell", "orchard_async.engine.pool", "module"),  # kit never imports engine
        ("orchard_async.kit.shell", "orchard_async.engine.pool", "lazy"),  # not even when called
        ("orchard_async.adapters.docker.adapter", "orchard_async.engine.pool", "module"),
        ("orchard_async.adapters.docker.adapter", "orchard_async.adapters.local", "module"),  # adapters: not each other
        ("orchard_async.recipes.swe.task", "orchard_async.kit.shell", "module"),  # recipes: public names only
        ("orchard_async.recipes.swe.task", "orchard_async.recipes.claw.task", "module"),
        ("orchard_async.engine.rollout", "orchard_async.apps.cli", "lazy"),  # layers never reach the apps
        ("orchard_async.records.trajectory", "orchard_async.engine.episode", "module"),
    ],
)
def test_a_wrong_import_is_caught(module: str, target: str, when: str) -> None:
    assert violations(module, [(target, when, 1)])


@pytest.mark.parametrize(
    ("module", "target", "when"),
    [
        ("orchard_async.engine.rollout", "orchard_async.kit.shell", "module"),
        ("orchard_async.images.build", "orchard_async.runtime", "lazy"),  # the recipes' IMAGES, read when asked
        ("orchard_async.adapters.local", "orchard_async.adapters.local_isolation", "module"),
        ("orchard_async.recipes.gui.task", "orchard_async.models.client", "module"),
        ("orchard_async.bench.service", "orchard_async.apps.cli", "module"),
    ],
)
def test_a_right_import_passes(module: str, target: str, when: str) -> None:
    assert violations(module, [(target, when, 1)]) == []
