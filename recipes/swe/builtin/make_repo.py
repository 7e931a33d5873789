"""Materialize the bundled SWE task repositories as deterministic git repos.

Each directory under ``repos/`` is the *base* source tree of one small
repository.  :func:`materialize` copies such a tree into a fresh directory,
turns it into a git repository with a single commit and returns the commit
hash.  Everything that feeds into the hash is pinned (file list and order,
file modes, line endings, author/committer identity and dates, commit
message, git configuration), so the same tree yields the same ``base_commit``
on every machine; ``instances.jsonl`` stores that hash.

Command line::

    python make_repo.py --check               # verify every instance's base_commit
    python make_repo.py --hashes              # print "<repo> <hash>" for each repo
    python make_repo.py --materialize REPO DEST
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPOS_DIR = HERE / "repos"
INSTANCES_PATH = HERE / "instances.jsonl"

# 2026-12-01T00:00:00Z, in git's internal "<epoch> <tz>" date format.
COMMIT_DATE = "1796083200 +0000"
COMMIT_MESSAGE = "base"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "orchard-swe",
    "GIT_AUTHOR_EMAIL": "swe-builtin@orchard.invalid",
    "GIT_AUTHOR_DATE": COMMIT_DATE,
    "GIT_COMMITTER_NAME": "orchard-swe",
    "GIT_COMMITTER_EMAIL": "swe-builtin@orchard.invalid",
    "GIT_COMMITTER_DATE": COMMIT_DATE,
}
# Configuration forced on every git invocation (user/system config is ignored).
GIT_CONFIG = (
    "core.autocrlf=false",
    "core.eol=lf",
    "core.safecrlf=false",
    "core.filemode=true",
    "core.symlinks=true",
    "core.excludesFile=",
    "core.hooksPath=/dev/null",
    "commit.gpgsign=false",
    "init.defaultBranch=main",
    "init.templateDir=",
)

# Generated junk that must never end up in a base commit.
EXCLUDED_DIR_NAMES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git", ".tox", ".venv"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".swp", "~")
EXCLUDED_FILE_NAMES = frozenset({".DS_Store"})


def repo_names() -> list[str]:
    """Names of the bundled repositories (sorted)."""
    return sorted(p.name for p in REPOS_DIR.iterdir() if p.is_dir() and not p.name.startswith("."))


def load_instances(path: pathlib.Path = INSTANCES_PATH) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def git_env() -> dict:
    """Environment for git: no inherited GIT_* variables, no user/system config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_IDENTITY)
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C",
            "TZ": "UTC",
        }
    )
    return env


def git(args: list[str], cwd: pathlib.Path, **kwargs) -> subprocess.CompletedProcess:
    cmd = ["git"]
    for item in GIT_CONFIG:
        cmd += ["-c", item]
    return subprocess.run(
        cmd + list(args),
        cwd=str(cwd),
        env=git_env(),
        check=True,
        capture_output=True,
        text=True,
        **kwargs,
    )


def source_files(repo_name: str) -> list[pathlib.PurePosixPath]:
    """Relative paths of the files making up ``repo_name``'s base tree, sorted."""
    root = REPOS_DIR / repo_name
    if not root.is_dir():
        raise ValueError(f"unknown repo {repo_name!r}; have {repo_names()}")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIR_NAMES)
        for name in sorted(filenames):
            if name in EXCLUDED_FILE_NAMES or name.endswith(EXCLUDED_SUFFIXES):
                continue
            full = pathlib.Path(dirpath) / name
            if full.is_symlink() or not full.is_file():
                raise ValueError(f"unsupported non-regular file in base tree: {full}")
            files.append(pathlib.PurePosixPath(full.relative_to(root).as_posix()))
    return sorted(files)


def materialize(repo_name: str, dest: pathlib.Path) -> str:
    """Copy ``repo_name``'s base tree into ``dest``, commit it, return the hash.

    ``dest`` must not exist or be an empty directory.  Files are written with
    mode 0644 and LF line endings; the commit uses fixed identity, dates and
    message, so the returned hash is reproducible.
    """
    dest = pathlib.Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"destination is not empty: {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    root = REPOS_DIR / repo_name
    for rel in source_files(repo_name):
        data = (root / rel).read_bytes().replace(b"\r\n", b"\n")
        target = dest.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, 0o644)
    git(["init", "-q"], dest)
    git(["add", "-A", "--force", "."], dest)
    git(["commit", "-q", "--no-verify", "--allow-empty-message", "-m", COMMIT_MESSAGE], dest)
    return git(["rev-parse", "HEAD"], dest).stdout.strip()


def compute_hashes() -> dict[str, str]:
    hashes = {}
    for name in repo_names():
        with tempfile.TemporaryDirectory(prefix=f"swe-{name}-") as tmp:
            hashes[name] = materialize(name, pathlib.Path(tmp) / name)
    return hashes


def check() -> int:
    """Verify every instance's ``base_commit``; return a process exit code."""
    hashes = compute_hashes()
    problems = []
    instances = load_instances()
    for inst in instances:
        expected = hashes.get(inst["repo"])
        if expected is None:
            problems.append(f"{inst['instance_id']}: unknown repo {inst['repo']!r}")
        elif inst["base_commit"] != expected:
            problems.append(f"{inst['instance_id']}: base_commit {inst['base_commit']} != materialized {expected}")
    for name, value in sorted(hashes.items()):
        print(f"{name} {value}")
    for problem in problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    print(
        f"checked {len(instances)} instances over {len(hashes)} repos: "
        f"{'OK' if not problems else f'{len(problems)} mismatches'}"
    )
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="verify base_commit of every instance")
    group.add_argument("--hashes", action="store_true", help="print the base commit of every repo")
    group.add_argument("--materialize", nargs=2, metavar=("REPO", "DEST"), help="materialize one repo")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    if args.hashes:
        for name, value in sorted(compute_hashes().items()):
            print(f"{name} {value}")
        return 0
    name, dest = args.materialize
    print(materialize(name, pathlib.Path(dest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
