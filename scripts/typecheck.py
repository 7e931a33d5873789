"""mypy over every module of the ``orchard_async`` namespace, against a baseline that only shrinks.

    python scripts/typecheck.py                   # `just lint` and .ci/run
    python scripts/typecheck.py --write-baseline  # after moving code: same errors, new places

Why a script and not ``mypy -p orchard_async``: the namespace spans four folders
(pyproject's package-dir: ``adapters/`` is ``orchard_async.adapters``, and so on), which
mypy's module finder cannot map, and the editable install's import hook is invisible to it.
So the module list is read from pyproject (``[tool.setuptools]`` packages and package-dir:
one owner of what the package is), each file handed to mypy under the name Python imports it
by, and the settings are pyproject's ``[tool.mypy]``.

Why a baseline: mypy found errors in the code as it was when the check came in. Every one
of them is in ``typecheck-baseline.txt`` (one line per error: file, message and code, no
line number, so edits elsewhere in a file do not move it). The check fails on an error
that is not there (new code is held to the full settings, in every module) and on a line
there that mypy no longer reports (a fixed error leaves the file, so it only shrinks).
``--write-baseline`` is for moves and renames: it rewrites the file from what mypy reports
now, and refuses when that would allow more errors of any code than before.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "typecheck-baseline.txt"
# "path:12: error: message  [code]"; notes and summary lines are not errors.
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")
LINE_REFERENCE = re.compile(r"\bline \d+")  # "already defined on line 12" moves with edits above it


def modules() -> list[tuple[str, str]]:
    """(path relative to the root, module name) of every .py file of every package in pyproject."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots: dict[str, str] = setuptools["package-dir"]
    found = []
    for package in setuptools["packages"]:
        mapped = max((name for name in roots if package == name or package.startswith(name + ".")), key=len)
        folder = ROOT / roots[mapped] / package[len(mapped) :].lstrip(".").replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            found.append((str(path.relative_to(ROOT)), name))
    return found


def key(line: str) -> tuple[str, str] | None:
    """The baseline's form of one error line (file, message and code), or None for a note."""
    match = ERROR.match(line)
    if match is None:
        return None
    message = LINE_REFERENCE.sub("line N", match["message"])
    return match["path"], f"{message}  [{match['code'] or 'misc'}]"


def run_mypy() -> list[str]:
    from mypy import build
    from mypy.errors import CompileError
    from mypy.main import process_options
    from mypy.modulefinder import BuildSource

    _, options = process_options([], require_targets=False)  # reads pyproject's [tool.mypy]
    sources = [BuildSource(path, name, None) for path, name in modules()]
    try:
        return build.build(sources, options).errors
    except CompileError as exc:  # a file mypy cannot parse stops the whole build
        return exc.messages


def read_baseline() -> collections.Counter[tuple[str, str]]:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in BASELINE.read_text().splitlines():
        if line and not line.startswith("#"):
            path, _, rest = line.partition(": ")
            counts[path, rest] += 1
    return counts


def write_baseline(found: collections.Counter[tuple[str, str]], mypy_version: str) -> None:
    header = [
        "# Errors mypy reported when the type check came in (scripts/typecheck.py); the check fails",
        "# on any error not listed here and on any line here mypy no longer reports: this file only",
        "# shrinks. One line per error, without its line number. Written with mypy " + mypy_version + ".",
    ]
    lines = sorted(f"{path}: {rest}" for (path, rest), count in found.items() for _ in range(count))
    BASELINE.write_text("\n".join(header + lines) + "\n")


def by_code(counts: collections.Counter[tuple[str, str]]) -> collections.Counter[str]:
    codes: collections.Counter[str] = collections.Counter()
    for (_, rest), count in counts.items():
        codes[rest.rsplit("[", 1)[-1].rstrip("]")] += count
    return codes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-baseline", action="store_true", help="rewrite the baseline (never to allow more)")
    args = parser.parse_args()
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError:
        print("typecheck: mypy is not installed; pip install -e '.[dev]'")
        return 2

    os.chdir(ROOT)  # pyproject's [tool.mypy], and the baseline's paths are relative to the root
    lines = run_mypy()
    found = collections.Counter(k for k in map(key, lines) if k is not None)
    allowed = read_baseline() if BASELINE.exists() else collections.Counter()
    baseline = BASELINE.relative_to(ROOT)

    if args.write_baseline:
        before, after = by_code(allowed), by_code(found)
        grown = {code: f"{before[code]} -> {n}" for code, n in after.items() if n > before[code]}
        if BASELINE.exists() and grown:
            print(f"typecheck: not writing {baseline}: it would allow more errors ({grown}); fix the new ones")
            return 1
        write_baseline(found, mypy_version)
        print(f"typecheck: wrote {baseline}: {sum(found.values())} errors in {len({p for p, _ in found})} files")
        return 0

    new, fixed = found - allowed, allowed - found
    if new:
        print(
            f"typecheck: {sum(new.values())} mypy error(s) beyond {baseline} (fix them; a repeated one is shown at each place):"
        )
        for line in lines:
            if key(line) in new:
                print("  " + line)
    if fixed:
        print(f"typecheck: {sum(fixed.values())} error(s) listed in {baseline} are fixed: delete these lines from it:")
        for (path, rest), count in sorted(fixed.items()):
            print(f"  {path}: {rest}" + (f"  (x{count})" if count > 1 else ""))
    if new or fixed:
        written = re.search(r"Written with mypy (\S+)\.", BASELINE.read_text()) if BASELINE.exists() else None
        if written and written[1] != mypy_version:
            print(f"typecheck: note: {baseline} was written with mypy {written[1]}; this is mypy {mypy_version}")
        return 1
    count = len(modules())
    print(
        f"typecheck: mypy {mypy_version} over {count} modules: no errors beyond the {sum(allowed.values())} of {baseline}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
