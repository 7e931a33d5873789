"""SWE-bench-style instances: the task format and its loader.

An instance is one JSON object. Required fields (SWE-bench's names):

    instance_id        unique id, e.g. "minicalc__1"
    repo               repository name, e.g. "minicalc" or "astropy/astropy"
    base_commit        the commit the agent starts from (hex)
    problem_statement  the issue text the agent sees
    patch              the gold fix (unified diff; the oracle policy applies it)
    test_patch         tests added by the fix (applied only when scoring)
    FAIL_TO_PASS       test ids that must go from failing to passing
    PASS_TO_PASS       test ids that must keep passing (may be empty)

FAIL_TO_PASS / PASS_TO_PASS may be lists or, as in the SWE-bench dataset files,
JSON strings holding a list. Optional fields:

    image              a prebuilt image with the repository at /testbed (SWE-bench
                       convention), used by container adapters
    repo_path          where to take the repository from when preparing the sandbox:
                       a git checkout or a git bundle, relative to the instances file
    setup_commands     shell commands run in the repository after checkout (list or string)
    test_command       how to run the tests (default: pytest -rA on the files the
                       test patch touches)
    env                extra environment variables for the sandbox (object of strings);
                       PYTEST_DISABLE_PLUGIN_AUTOLOAD "" lets pytest load installed plugins
    activate           shell run before the recipe's commands in the sandbox to switch the
                       project's environment on (default: SWE-bench's conda env in its images)

Unknown fields (``version``, ``hints_text``, ``created_at``, ...) are kept in
``extra``; SWE-bench's evaluation fields there (``version``, ``eval_script``,
``log_parser``, ``eval_type``) let the ``swebench`` package grade the instance
(swebench_harness.py). Files are JSON Lines (one object a line) or JSON (a
list of objects, or an object with an ``instances`` list); every error names the file,
the line and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard_async import ConfigError
from orchard_async.recipes.swe import formats
from orchard_async.recipes.swe.formats import ProScripts

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
OPTIONAL = ("image", "repo_path", "setup_commands", "test_command", "env", "activate")
_HEX = re.compile(r"^[0-9a-f]{7,64}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DIFF_FILES = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_PLUS_FILES = re.compile(r"^\+\+\+ b/(\S+)", re.MULTILINE)
_MINUS_FILES = re.compile(r"^--- a/(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    image: str | None = None
    repo_path: str | None = None  # absolute, once loaded
    setup_commands: tuple[str, ...] = ()
    test_command: str = ""
    env: dict[str, str] = field(default_factory=dict)
    activate: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    where: str = ""  # "file:line", for messages
    # How the row's publisher runs and grades it (formats.py); SWE-bench's way by default.
    format: str = formats.SWE_BENCH
    workdir: str | None = None  # where the image keeps the repository (None: SWE-bench's /testbed)
    enter_commands: tuple[str, ...] = ()
    log_parser: str = ""
    gold_reverse: bool = False
    test_stage: str = ""
    pro: ProScripts | None = None

    @property
    def test_files(self) -> list[str]:
        """Files the test patch touches (restored to base before it is applied)."""
        return patch_files(self.test_patch)

    def default_test_command(self) -> str:
        files = " ".join(sorted({f for f in self.test_files if f.endswith(".py")}))
        return f"python -m pytest -rA -p no:cacheprovider {files}".rstrip()


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches, in order of appearance, without /dev/null."""
    found: list[str] = []
    pairs = _DIFF_FILES.findall(patch)
    names = (
        [name for pair in pairs for name in pair] if pairs else _MINUS_FILES.findall(patch) + _PLUS_FILES.findall(patch)
    )
    for name in names:
        if name not in found and name != "dev/null":
            found.append(name)
    return found


class _Bad(Exception):
    """A problem with one field; the loader adds file, line and instance id."""


def _string(data: dict, key: str, *, empty: bool = False) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise _Bad(f"field {key!r} must be a string, got {type(value).__name__}")
    if not empty and not value.strip():
        raise _Bad(f"field {key!r} must not be empty")
    return value


def _test_ids(data: dict, key: str, *, allow_empty: bool) -> tuple[str, ...]:
    value = data[key]
    if isinstance(value, str):  # the SWE-bench dataset stores these lists as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _Bad(f"field {key!r} is a string but not a JSON list of test ids: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise _Bad(f"field {key!r} must be a list of test ids (non-empty strings)")
    if len(set(value)) != len(value):
        dupes = sorted({item for item in value if value.count(item) > 1})
        raise _Bad(f"field {key!r} lists a test more than once: {dupes[:3]}")
    if not value and not allow_empty:
        raise _Bad(f"field {key!r} must name at least one test")
    return tuple(value)


def parse_instance(
    data: Any,
    *,
    base_dir: Path | None = None,
    where: str = "",
    format: str | None = None,
    pro_scripts: Path | None = None,
) -> Instance:
    """Validate one instance object, read in its format (``format``, else detected: see
    formats.py). Raises ``_Bad`` naming the field."""
    if not isinstance(data, dict):
        raise _Bad(f"an instance must be a JSON object, got {type(data).__name__}")
    row = data
    try:
        fmt, mapped = formats.read(row, formats.Context(base_dir, pro_scripts), format)
    except formats.FormatError as exc:
        raise _Bad(str(exc)) from None
    data = mapped.fields
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise _Bad(f"missing required field{'s' if len(missing) > 1 else ''} {', '.join(repr(k) for k in missing)}")
    instance_id = _string(data, "instance_id")
    base_commit = _string(data, "base_commit").strip()
    if not _HEX.match(base_commit) and fmt.name != formats.SMITH:  # SWE-smith's base is a branch
        raise _Bad(f"field 'base_commit' must be a lowercase hex commit id, got {base_commit!r}")
    test_patch = _string(data, "test_patch", empty=True)
    tests_in_repo = fmt.name == formats.SMITH  # SWE-smith's tests are in the instance's branch
    if (test_patch.strip() or not tests_in_repo) and not patch_files(test_patch):
        raise _Bad("field 'test_patch' is not a unified diff (no file headers found)")
    f2p = _test_ids(data, "FAIL_TO_PASS", allow_empty=False)
    p2p = _test_ids(data, "PASS_TO_PASS", allow_empty=True)
    overlap = sorted(set(f2p) & set(p2p))
    if overlap:
        raise _Bad(f"fields 'FAIL_TO_PASS' and 'PASS_TO_PASS' both list {overlap[:3]}")
    image = mapped.image or data.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise _Bad("field 'image' must be a non-empty string when given")
    repo_path = data.get("repo_path")
    if repo_path is not None:
        if not isinstance(repo_path, str) or not repo_path.strip():
            raise _Bad("field 'repo_path' must be a non-empty string when given")
        path = Path(repo_path).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.exists():
            raise _Bad(f"field 'repo_path': {path} does not exist")
        repo_path = str(path.resolve())
    setup = data.get("setup_commands")
    if setup is None:
        setup = ()
    elif isinstance(setup, str):
        setup = (setup,) if setup.strip() else ()
    elif isinstance(setup, list) and all(isinstance(cmd, str) for cmd in setup):
        setup = tuple(cmd for cmd in setup if cmd.strip())
    else:
        raise _Bad("field 'setup_commands' must be a string or a list of strings")
    test_command = mapped.test_command or data.get("test_command", "")
    if not isinstance(test_command, str):
        raise _Bad("field 'test_command' must be a string")
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) and _ENV_KEY.match(k) for k, v in env.items()):
        raise _Bad("field 'env' must be an object of NAME: string (NAME a shell identifier)")
    activate = mapped.activate or data.get("activate", "")
    if not isinstance(activate, str):
        raise _Bad("field 'activate' must be a string (shell commands)")
    known = set(REQUIRED) | set(OPTIONAL)
    return Instance(
        instance_id=instance_id,
        repo=_string(data, "repo"),
        base_commit=base_commit,
        problem_statement=_string(data, "problem_statement"),
        patch=_string(data, "patch", empty=True),
        test_patch=test_patch,
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        image=image,
        repo_path=repo_path,
        setup_commands=setup,
        test_command=test_command.strip(),
        env=dict(env),
        activate=activate.strip(),
        extra={k: v for k, v in row.items() if k not in known},
        where=where,
        format=fmt.name,
        workdir=mapped.workdir,
        enter_commands=mapped.enter_commands,
        log_parser=mapped.log_parser,
        gold_reverse=mapped.gold_reverse,
        test_stage=mapped.test_stage,
        pro=mapped.pro,
    )


def _json_array_items(text: str, path: Path) -> list[tuple[int, Any]]:
    """(line, value) of each element of a top-level JSON array or ``{"instances": [...]}``."""
    decoder = json.JSONDecoder()

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    try:
        whole = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if isinstance(whole, dict) and "instances" in whole:
        start = text.find("[", text.find('"instances"'))
    elif isinstance(whole, list):
        start = text.find("[")
    elif isinstance(whole, dict):
        return [(1, whole)]  # a single instance
    else:
        raise ConfigError(f"{path}:1: expected a JSON list of instances, got {type(whole).__name__}")
    items: list[tuple[int, Any]] = []
    pos = start + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items
        value, end = decoder.raw_decode(text, pos)
        items.append((line_of(pos), value))
        pos = end


def _parquet_rows(path: Path) -> list[tuple[int, Any]]:
    """(row number, row) of a Parquet export of a dataset (Hugging Face's ``data/*.parquet``)."""
    try:
        import pyarrow.parquet as parquet  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow") from None
    try:
        rows = parquet.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet
        raise ConfigError(f"{path}: not a readable Parquet file: {exc}") from None
    return list(enumerate(rows, 1))


def load_instances(
    path: str | Path, *, format: str | None = None, pro_scripts: str | Path | None = None
) -> list[Instance]:
    """Every instance in a ``.jsonl``, ``.json`` or ``.parquet`` file, validated; errors say
    file:line (a Parquet file's row) and field. ``format`` reads every row in that format
    (formats.FORMATS), else each row's is detected. ``pro_scripts``: SWE-bench Pro's
    ``run_scripts`` folder (default: ``run_scripts`` next to the file)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such task file (give a .jsonl, .json or .parquet file of instances, or 'builtin')"
        )
    if format is not None and format not in formats.FORMATS:
        raise ConfigError(f"unknown SWE dataset format {format!r}; known: {', '.join(formats.FORMATS)}")
    scripts = Path(pro_scripts).expanduser() if pro_scripts else path.parent / "run_scripts"
    if path.suffix.lower() == ".parquet":
        items = _parquet_rows(path)
    else:
        items = _text_rows(path)
    instances: list[Instance] = []
    seen: dict[str, int] = {}
    for number, data in items:
        label = data.get("instance_id") if isinstance(data, dict) else None
        prefix = f"{path}:{number}: instance {label!r}" if isinstance(label, str) else f"{path}:{number}"
        try:
            instance = parse_instance(
                data, base_dir=path.parent, where=f"{path}:{number}", format=format, pro_scripts=scripts
            )
        except _Bad as exc:
            raise ConfigError(f"{prefix}: {exc}") from None
        if instance.instance_id in seen:
            raise ConfigError(f"{prefix}: duplicate instance_id (first on line {seen[instance.instance_id]})")
        seen[instance.instance_id] = number
        instances.append(instance)
    if not instances:
        raise ConfigError(f"{path}: no instances in the file")
    return instances


def _text_rows(path: Path) -> list[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        return _json_array_items(text, path)
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    return items
