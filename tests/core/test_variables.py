"""The table of environment variables is the truth: every ``ORCHARD_*`` name the source tree
reads is declared in the registry (``orchard_async.apps.variables``), every declared one is
still read somewhere, a recipe's variables are read only as its options' defaults, and
docs/variables.md is the page the registry generates."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from orchard_async.apps import variables
from orchard_async.models import client

ROOT = Path(__file__).resolve().parents[2]
PYTHON_TREES = ("orchard_async", "adapters", "recipes", "bench", "tests", "scripts", "deploy")
SHELL_FILES = (*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run")
NAME = r"ORCHARD_[A-Z0-9]+(?:_[A-Z0-9]+)*"
# A read through os.environ / os.getenv / a mapping named env, or a test setting one.
PYTHON_READ = re.compile(
    rf"""(?:environ\.get|environ\.pop|environ\.setdefault|getenv|environ\[|\benv\.get|setenv|delenv)\(?\s*["']({NAME})["']"""
)
SHELL_USE = re.compile(rf"\$\{{?({NAME})\b")  # $NAME or ${NAME...}, in a script or a shell snippet in Python
SHELL_SET = re.compile(rf"(?:^|[\s;]|export\s+)({NAME})=", re.MULTILINE)
# Names in the code that are not variables.
NOT_VARIABLES = re.compile(r"ORCHARD_PATCH(?:_\d+)?")  # the SWE oracle's here-document delimiter (and its tests')


def python_files() -> list[Path]:
    """The tree's Python files, but this one (its examples are made-up names)."""
    here = Path(__file__).resolve()
    return sorted(
        path
        for tree in PYTHON_TREES
        for path in (ROOT / tree).rglob("*.py")
        if "__pycache__" not in path.parts and path.resolve() != here
    )


def names_in_python(path: Path, *, shell: bool = True) -> set[str]:
    """Every ORCHARD_* name a Python file reads or passes on: by a read of the environment, as
    a string that is exactly a name (a constant such as ``IMAGE_ENV = "ORCHARD_..."`` read
    elsewhere, an ``env={...}`` key), or (``shell``) as ``$NAME`` in a shell snippet it runs."""
    text = path.read_text()
    found = set(PYTHON_READ.findall(text)) | (set(SHELL_USE.findall(text)) if shell else set())
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(NAME, node.value):
            found.add(node.value)
    return {name for name in found if not NOT_VARIABLES.fullmatch(name)}


def names_in_shell(path: Path) -> set[str]:
    text = path.read_text()
    return set(SHELL_USE.findall(text)) | set(SHELL_SET.findall(text))


@functools.cache
def used() -> dict[str, list[str]]:
    """Name -> the files that read it."""
    where: dict[str, list[str]] = {}
    for path in python_files():
        for name in names_in_python(path):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    for path in SHELL_FILES:
        for name in names_in_shell(path):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return where


def test_every_variable_the_tree_reads_is_in_the_registry() -> None:
    declared = {v.name for v in variables.registry()}
    missing = {name: files for name, files in sorted(used().items()) if name not in declared}
    assert missing == {}, "declare these in orchard_async/apps/variables.py (or their recipe's options)"


def test_every_declared_variable_is_still_read_somewhere() -> None:
    read = used()
    assert [v.name for v in variables.registry() if v.name not in read] == []


def test_every_declaration_says_who_owns_it_its_default_and_what_it_means() -> None:
    for variable in variables.registry():
        assert re.fullmatch(NAME, variable.name), variable
        assert variable.owner and variable.default and variable.meaning, variable


def test_a_recipe_reads_its_variables_only_as_its_options_defaults() -> None:
    """In recipes/, no ORCHARD_* variable is read from the environment directly (the model
    client's aside: ``ModelConfig`` is their one place), and every ORCHARD_* name the
    controller's side holds is one of the recipes' options' variables. The sandbox's side (the
    files that run inside it, the shell snippets it runs) reads what it is handed."""
    options = {info.env for cls in variables.recipe_options().values() for info in cls.fields() if info.env}
    models = set(client.ENVIRONMENT)
    direct, stray = [], []
    for path in sorted((ROOT / "recipes").rglob("*.py")):
        relative = path.relative_to(ROOT)
        if {"inside", "sandbox"} & set(relative.parts):
            continue
        direct += [f"{relative}: {name}" for name in PYTHON_READ.findall(path.read_text()) if name not in models]
        stray += [f"{relative}: {name}" for name in names_in_python(path, shell=False) if name not in options | models]
    assert direct == [], "read these through the recipe's options (RecipeOptions.from_env)"
    assert stray == []


def test_the_docs_page_is_the_generated_one() -> None:
    page = ROOT / "docs" / "variables.md"
    assert page.read_text() == variables.markdown(), (
        "regenerate it: python -m orchard_async.apps.variables --write docs/variables.md"
    )


@pytest.mark.parametrize(
    ("snippet", "name"),
    [
        ('x = os.environ.get("ORCHARD_NEW_THING")\n', "ORCHARD_NEW_THING"),
        ('x = os.getenv("ORCHARD_NEW_THING", "1")\n', "ORCHARD_NEW_THING"),
        ('x = os.environ["ORCHARD_NEW_THING"]\n', "ORCHARD_NEW_THING"),
        ('NEW_ENV = "ORCHARD_NEW_THING"  # read elsewhere as env.get(NEW_ENV)\n', "ORCHARD_NEW_THING"),
        ('cmd = "cd \\"$ORCHARD_NEW_THING\\""\n', "ORCHARD_NEW_THING"),
    ],
)
def test_the_scan_sees_a_new_read(tmp_path: Path, snippet: str, name: str) -> None:
    path = tmp_path / "new.py"
    path.write_text("import os\n" + snippet)
    assert names_in_python(path) == {name}
    assert name not in {v.name for v in variables.registry()}  # so the first test would fail on it


def test_the_scan_sees_a_new_variable_in_a_script(tmp_path: Path) -> None:
    path = tmp_path / "new.sh"
    path.write_text('WORK=${ORCHARD_NEW_DIR:-/tmp}\nexport ORCHARD_NEW_FLAG=1\necho "$ORCHARD_OTHER"\n')
    assert names_in_shell(path) == {"ORCHARD_NEW_DIR", "ORCHARD_NEW_FLAG", "ORCHARD_OTHER"}


def test_markers_that_only_look_like_variables_are_not_counted(tmp_path: Path) -> None:
    path = tmp_path / "markers.py"
    path.write_text('TAG = "ORCHARD_PATCH"\nRC = "@@ORCHARD_TEST_RC="\nnth = f"ORCHARD_PATCH_{n}"\n')
    assert names_in_python(path) == set()
