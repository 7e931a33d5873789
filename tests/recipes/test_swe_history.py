"""The agent's repository after setup holds its tree and nothing else (repo.drop_history): a
repository with the fix hidden in every place git keeps things (a branch, tags, a stash, the
reflog and ORIG_HEAD, a remote's ref, notes, a worktree, packed refs, a dangling blob, an
alternate object store) comes out as one root commit of HEAD's tree, its index, excludes and
staged work intact. The script runs with the host's git, as a sandbox runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchard_async.recipes.swe.repo import ROOT_MESSAGE, drop_history_script

BUG = "def add(a, b):\n    return a - b\n"
FIX = "def add(a, b):\n    return a + b\n"
ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=repo, env=ENV, input=stdin, capture_output=True, text=True)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.strip()


def riddled(repo: Path, alternate: Path) -> str:
    """A repository at a buggy base with the fix kept everywhere git can keep it; returns the base."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(BUG)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "fixed")
    (repo / "calc.py").write_text(FIX)
    git(repo, "commit", "-qam", "the fix")
    git(repo, "tag", "v2")
    git(repo, "tag", "-am", "annotated", "v2-annotated")
    git(repo, "checkout", "-q", "main")
    git(repo, "remote", "add", "origin", "https://example.invalid/calc.git")
    git(repo, "update-ref", "refs/remotes/origin/main", "fixed")
    git(repo, "notes", "add", "-m", f"the fix is:\n{FIX}", base)
    git(repo, "worktree", "add", "-q", str(repo.parent / "other-worktree"), "fixed")
    (repo / "calc.py").write_text(FIX)
    git(repo, "stash", "-q")
    (repo / "calc.py").write_text(FIX)
    git(repo, "commit", "-qam", "fixed, then taken back")
    git(repo, "reset", "-q", "--hard", "HEAD~1")  # the reflog and ORIG_HEAD still name it
    git(repo, "hash-object", "-w", "--stdin", stdin=FIX + "# dangling\n")
    git(repo, "pack-refs", "--all")
    # an alternate object store holding one more fixed version, as images built from a clone with --reference do
    git(alternate.parent, "init", "-q", "--bare", str(alternate))
    blob = git(alternate, "hash-object", "-w", "--stdin", stdin=FIX + "# alternate\n")
    (repo / ".git/objects/info/alternates").write_text(str(alternate / "objects") + "\n")
    assert git(repo, "cat-file", "-t", blob) == "blob"
    # what setup leaves and must stay: an excluded build product and a staged file
    (repo / ".git/info").mkdir(exist_ok=True)
    (repo / ".git/info/exclude").write_text("/build-product\n")
    (repo / "build-product").write_text("untracked, excluded\n")
    (repo / "staged.py").write_text("STAGED = True\n")
    git(repo, "add", "staged.py")
    return base


def every_object(repo: Path) -> str:
    """The content of every object the repository can read (trees are binary)."""
    command = ["git", "cat-file", "--batch-all-objects", "--batch", "--unordered"]
    done = subprocess.run(command, cwd=repo, env=ENV, capture_output=True, check=True)
    return done.stdout.decode("utf-8", "replace")


@pytest.mark.parametrize("detached", [False, True])
def test_nothing_but_the_tree_is_left(tmp_path: Path, detached: bool) -> None:
    repo = tmp_path / "repo"
    base = riddled(repo, tmp_path / "alternate.git")
    if detached:
        git(repo, "checkout", "-q", "--detach")
    assert FIX in every_object(repo)  # the fix is there to find before
    status = git(repo, "status", "--porcelain")
    tree = git(repo, "rev-parse", "HEAD^{tree}")

    root = _drop(repo)

    shutil.rmtree(tmp_path / "alternate.git")  # nothing is read from elsewhere any more
    git(repo, "fsck", "--strict", "--no-dangling")
    assert git(repo, "rev-parse", "HEAD") == root != base
    assert git(repo, "rev-parse", "HEAD^{tree}") == tree and git(repo, "cat-file", "-p", root).endswith(ROOT_MESSAGE)
    assert git(repo, "rev-list", "--all", "--reflog") == root  # one commit, no parent, no reflog
    assert git(repo, "for-each-ref", "--format=%(refname)") == ("" if detached else "refs/heads/main")
    assert (git(repo, "symbolic-ref", "-q", "HEAD") if not detached else "") == ("" if detached else "refs/heads/main")
    assert git(repo, "stash", "list") == git(repo, "remote") == git(repo, "notes", "list") == ""
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not (repo / ".git/ORIG_HEAD").exists() and not (repo / ".git/packed-refs").exists()
    kept = every_object(repo)
    assert "return a + b" not in kept and "STAGED = True" in kept  # the staged file's blob stays
    assert git(repo, "status", "--porcelain") == status  # the index and the excludes as they were
    assert git(repo, "diff", "--cached", "--name-only", root) == "staged.py"


def _drop(repo: Path) -> str:
    done = subprocess.run(["sh", "-c", drop_history_script()], cwd=repo, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_commit_is_the_same_in_every_sandbox_of_an_instance(tmp_path: Path) -> None:
    """The agent's diff is read against the commit setup made: every copy of the instance's
    repository gets the same one, whatever it held besides the tree."""
    first = tmp_path / "first"
    riddled(first, tmp_path / "alternate.git")
    second = tmp_path / "second"
    shutil.copytree(first, second, symlinks=True)
    git(second, "tag", "extra", "fixed")
    assert _drop(first) == _drop(second)
