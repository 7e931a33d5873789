"""Getting a repository at ``base_commit`` into a sandbox.

Two ways, chosen per sandbox at setup:

* **Prepared image** (SWE-bench convention): the sandbox's working directory already is a
  git checkout (``/testbed`` in the instance's image). It is used as it is, after checking
  that HEAD is the base commit.
* **Prepared by the recipe** (the local adapter, or an image without the repository): on
  the host, the source (a bundled tree, a git checkout or a git bundle) is turned once
  into a git pack holding only ``base_commit`` and its ancestors, so the agent cannot
  find the fix in later history. Each sandbox receives it through ``exec`` stdin and
  writes it, with the pack's index made on the host, into a fresh repository in its
  working directory: only ``sh``, ``git`` and POSIX tools are needed inside, which holds
  on every adapter. Every SWE episode does this twice (the agent's sandbox and the
  scorer's), so it is kept cheap: no object is hashed again in the sandbox, three git
  commands (see ``checkout``).

Either way the agent's repository is then cut down to its tree (``drop_history``): the
datasets' images keep the fix in reach (SWE-smith's instance is a bug commit on top of the
clean code; SWE-bench Pro's image holds the gold commit; other images keep the upstream
history past the base in tags, branches or loose objects), so the agent gets one fresh
root commit of the base's tree and nothing else. The scorer's sandbox keeps the history:
the agent never reaches it, and the datasets' test staging reads it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from orchard_async import ConfigError, ExecResult, Sandbox, SandboxLost
from orchard_async.recipes.swe.builtin import REPOS_DIR, make_repo

BASE_REF = "refs/heads/orchard-base"
EXCLUDES = ("__pycache__/", "*.pyc", ".pytest_cache/", ".orchard/")  # never part of the agent's patch


@dataclass(frozen=True)
class RepoPack:
    """``commit`` and its ancestors as one git pack with its index, made on the host: a
    sandbox writes both files and has the objects, without hashing every one of them again
    (``index-pack`` of a large repository's history is seconds of CPU, per sandbox)."""

    name: str  # the pack's checksum, as git names the files: pack-<name>.pack / .idx
    pack: bytes
    idx: bytes


@dataclass(eq=False)
class RepoSource:
    """Where a repository comes from on the host. ``kind``: builtin, git or bundle."""

    kind: str
    location: str  # builtin repo name, or an absolute path
    _packs: dict[str, RepoPack] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def describe(self) -> str:
        return f"bundled repo {self.location}" if self.kind == "builtin" else f"{self.kind} {self.location}"

    async def pack(self, commit: str) -> RepoPack:
        """``commit`` and its ancestors, nothing else, packed (built once, in a thread)."""
        cached = self._packs.get(commit)
        if cached is not None:
            return cached
        return await anyio.to_thread.run_sync(self._build, commit)

    def _build(self, commit: str) -> RepoPack:
        with self._lock:
            if commit in self._packs:
                return self._packs[commit]
            with tempfile.TemporaryDirectory(prefix="orchard-swe-src-") as tmp:
                work = Path(tmp)
                if self.kind == "builtin":
                    repo = work / "repo"
                    got = make_repo.materialize(self.location, repo)
                    if got != commit:
                        raise ConfigError(
                            f"bundled repo {self.location} materializes to commit {got}, but the instance wants "
                            f"{commit}: regenerate instances.jsonl (see recipes/swe/builtin/README.md)"
                        )
                else:
                    repo = work / "repo.git"
                    shared = ["--shared"] if self.kind == "git" else []
                    _git(["clone", "-q", "--bare", "--no-tags", *shared, self.location, str(repo)], work)
                    if _git(["cat-file", "-e", f"{commit}^{{commit}}"], repo, check=False).returncode != 0:
                        raise ConfigError(f"commit {commit} is not in {self.describe()}")
                _git(["update-ref", BASE_REF, commit], repo)
                name = _git(["pack-objects", "--revs", "-q", str(work / "pack")], repo, stdin=f"{BASE_REF}\n")
                name = name.stdout.strip()
                packed = RepoPack(
                    name, (work / f"pack-{name}.pack").read_bytes(), (work / f"pack-{name}.idx").read_bytes()
                )
            self._packs[commit] = packed
            return packed


def _git(args: list[str], cwd: Path, *, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", *args],
        cwd=cwd,
        env=make_repo.git_env(),
        capture_output=True,
        input=stdin,
        text=True,
    )
    if check and done.returncode != 0:
        raise ConfigError(f"git {' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def builtin_repos() -> list[str]:
    return make_repo.repo_names()


def find_source(repo: str, repo_path: str | None, search_dir: Path | None) -> RepoSource | None:
    """The host source of ``repo``: the instance's ``repo_path``; else ``repos/<name>`` (a git
    checkout) or ``repos/<name>.bundle`` next to the instances file, ``/`` in the name written
    as ``__``; else a bundled repo of that name. None when there is none."""
    candidates = [Path(repo_path)] if repo_path else []
    if search_dir is not None:
        name = repo.replace("/", "__")
        candidates += [search_dir / "repos" / name, search_dir / "repos" / f"{name}.bundle"]
    for path in candidates:
        if path.is_file():
            return RepoSource("bundle", str(path.resolve()))
        if (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir()):
            return RepoSource("git", str(path.resolve()))
    if repo_path:
        raise ConfigError(f"repo_path {repo_path} is neither a git repository nor a git bundle")
    if (REPOS_DIR / repo).is_dir() and repo in builtin_repos():
        return RepoSource("builtin", repo)
    return None


# -- inside the sandbox ------------------------------------------------------------------------


def check_result(result: ExecResult, what: str) -> str:
    """The command's stdout; SandboxLost for infrastructure failures, RuntimeError otherwise."""
    if result.reason.is_infra:
        raise SandboxLost(f"{what}: {result.error_text or result.reason.value}")
    if not result.ok:
        detail = (result.error_text or result.text).strip()[-2000:]
        raise RuntimeError(f"{what} failed ({result.reason.value}, exit {result.exit_code}): {detail}")
    return result.text


async def existing_checkout(sandbox: Sandbox, time_limit: float) -> str | None:
    """HEAD of the git repository rooted at the sandbox's working directory, if there is one."""
    script = 'top=$(git rev-parse --show-toplevel 2>/dev/null) && [ "$top" = "$(pwd -P)" ] && git rev-parse HEAD'
    result = await sandbox.exec(script, timeout=time_limit)
    if result.reason.is_infra:
        raise SandboxLost(f"probing for a checkout: {result.error_text or result.reason.value}")
    head = result.text.strip()
    return head if result.ok and head else None


# The repository's own settings, written as one file append (a shell builtin) rather than a
# `git config` process each.
GIT_CONFIG = (
    "[user]\n\tname = agent\n\temail = agent@orchard.invalid\n[core]\n\tpager = cat\n[advice]\n\tdetachedHead = false\n"
)


def _git_setup_lines(*, fresh: bool = True) -> list[str]:
    """Excludes and settings; a ``fresh`` repository (no config of its own yet) gets its
    settings appended as text, an image's through ``git config``."""
    excludes = " ".join(f"'{pattern}'" for pattern in EXCLUDES)
    settings = (
        [f"printf '{GIT_CONFIG}' >> .git/config"]
        if fresh
        else [
            "git config user.name agent && git config user.email agent@orchard.invalid",
            "git config core.pager cat && git config advice.detachedHead false",
        ]
    )
    return [f"mkdir -p .git/info && printf '%s\\n' {excludes} >> .git/info/exclude", *settings]


PACK_DIR = ".git/objects/pack"


async def checkout(sandbox: Sandbox, packed: RepoPack, commit: str, time_limit: float) -> None:
    """A new repository in the working directory from ``packed`` (the pack, then its index,
    on stdin), at ``commit`` on branch ``main``. Three git processes, the rest small tools
    and shell builtins: ``init`` without the template directory (its sample hooks are files
    to copy, and never run here); the pack and index written as they came (the index is cut
    off the end, ``dd`` truncates without copying the pack); HEAD and the branch written as
    files (``init -b`` needs git 2.28); ``reset --hard``, which fails unless the pack holds
    the commit and its tree; ``rev-parse``."""
    stem = f"{PACK_DIR}/pack-{packed.name}"
    size = len(packed.pack)
    script = "\n".join(
        [
            "set -e",
            "git init -q --template= .",
            f"cat > {stem}.pack",
            f"tail -c +{size + 1} {stem}.pack > {stem}.idx",
            f"dd if=/dev/null of={stem}.pack bs=1 seek={size} 2>/dev/null",
            "printf 'ref: refs/heads/main\\n' > .git/HEAD",
            f"printf '%s\\n' {commit} > .git/refs/heads/main",
            "git reset -q --hard",
            *_git_setup_lines(),
            "git rev-parse HEAD",
        ]
    )
    stdin = packed.pack + packed.idx
    head = check_result(
        await sandbox.exec(script, stdin=stdin, timeout=time_limit), "checking out the repository"
    ).strip()
    if head.splitlines()[-1:] != [commit]:
        raise RuntimeError(f"the checkout is at {head!r}, expected {commit}")


# Untracked files already there (an image's build products its .gitignore misses) are part of
# the environment, not of anyone's patch: excluded from the diff, anchored at the root.
EXCLUDE_UNTRACKED = "git ls-files --others --exclude-standard --directory | sed 's|^|/|' >> .git/info/exclude"


async def adopt_checkout(sandbox: Sandbox, head: str, commit: str, time_limit: float) -> None:
    """Use the image's own checkout: it must be at ``commit`` (a prefix is enough; a branch
    name, as SWE-smith's instances are, is resolved in the repository)."""
    if not re.fullmatch(r"[0-9a-f]{7,64}", commit):
        resolved = await sandbox.exec(
            f"git rev-parse --verify -q {shlex.quote(commit + '^{commit}')}", timeout=time_limit
        )
        check_result(resolved, f"finding {commit} in the image's repository")
        commit = resolved.text.strip()
    if not head.startswith(commit) and not commit.startswith(head):
        raise RuntimeError(f"the image's repository is at {head}, but the instance's base_commit is {commit}")
    script = "\n".join(["set -e", *_git_setup_lines(fresh=False), EXCLUDE_UNTRACKED])
    check_result(await sandbox.exec(script, timeout=time_limit), "configuring git")


ROOT_IDENTITY = "orchard"
ROOT_EMAIL = "orchard@orchard.invalid"
ROOT_MESSAGE = "The task's repository at its base commit (the history is not part of the task)"
# What stays of .git besides the new objects, refs and HEAD: the settings (remotes removed),
# the index (its entries are the kept tree's blobs, so no file is hashed again), the
# excludes and checkout settings, hooks, submodules' repositories and LFS files. Anything
# else may reach a commit (refs, reflogs, ORIG_HEAD, stashes, worktrees, rerere's cache,
# alternates, grafts, shallow, sequencer state) and goes.
KEPT_IN_GIT_DIR = "config|index|sharedindex.*|info|hooks|modules|lfs|description"
KEPT_IN_INFO = "exclude|attributes|sparse-checkout"


def drop_history_script() -> str:
    """Shell (in the repository's root) that replaces the repository's objects and refs by one
    root commit of HEAD's tree, on HEAD's branch (or detached, as HEAD was), and prints it.

    The commit is a function of the tree and the base's commit time (fixed identity and
    message), so every sandbox of an instance gets the same one; its tree is the base's, so
    a diff against it is the diff against the base. The kept objects are packed from the
    old repository (``pack-objects``, deltas reused where their bases stay) before the old
    .git content is removed; the index stays as it was."""
    return "\n".join(
        [
            "set -e",
            '[ -d .git ] || { echo "the git directory is not ./.git" >&2; exit 3; }',  # prepare found the root
            "set -- $(git -c log.showSignature=false show -s --format='%T %ct' HEAD)",
            'tree=$1 when="@$2 +0000"',
            f'root=$(GIT_AUTHOR_NAME={ROOT_IDENTITY} GIT_AUTHOR_EMAIL={ROOT_EMAIL} GIT_AUTHOR_DATE="$when" '
            f'GIT_COMMITTER_NAME={ROOT_IDENTITY} GIT_COMMITTER_EMAIL={ROOT_EMAIL} GIT_COMMITTER_DATE="$when" '
            f'git -c commit.gpgSign=false commit-tree "$tree" -m {shlex.quote(ROOT_MESSAGE)})',
            "branch=$(git symbolic-ref -q HEAD || true)",
            'for remote in $(git remote); do git config --remove-section "remote.$remote"; done',
            # pack-objects renames its temporary files into place: the pack is made inside .git.
            # The index's objects too (what setup may have staged: the kept index names them).
            # No delta search and light compression: the pack only lives in this sandbox, and
            # the CPU is setup time (a 2,500-file, 100 MB tree: 0.4 s against 1.1 s by default).
            # Other worktrees go first: pack-objects would keep what their indexes name.
            "kept=.git/orchard-kept && rm -rf $kept .git/worktrees && mkdir $kept",
            'name=$(echo "$root" | git -c pack.compression=1 pack-objects -q --revs --indexed-objects --window=0 '
            '"$kept/pack")',
            "cd .git",
            "for entry in * .[!.]*; do",
            f'  case "$entry" in {KEPT_IN_GIT_DIR}|orchard-kept) ;; *) rm -rf -- "$entry" ;; esac',
            "done",
            "for entry in info/* info/.[!.]*; do",
            f'  case "${{entry#info/}}" in {KEPT_IN_INFO}) ;; *) rm -rf -- "$entry" ;; esac',
            "done",
            "mkdir -p objects/pack objects/info refs/heads refs/tags",
            'mv "orchard-kept/pack-$name.pack" "orchard-kept/pack-$name.idx" objects/pack/ && rmdir orchard-kept',
            'if [ -n "$branch" ]; then',
            '  mkdir -p "$(dirname "$branch")" && printf \'%s\\n\' "$root" > "$branch"',
            "  printf 'ref: %s\\n' \"$branch\" > HEAD",
            "else",
            "  printf '%s\\n' \"$root\" > HEAD",
            "fi",
            "cd ..",
            "git rev-parse --verify HEAD",
        ]
    )


async def drop_history(sandbox: Sandbox, time_limit: float) -> str:
    """Leave the sandbox's repository nothing but its tree as one root commit (see
    ``drop_history_script``); returns that commit."""
    out = check_result(await sandbox.exec(drop_history_script(), timeout=time_limit), "removing the history")
    root = out.strip().splitlines()[-1:]
    if not root or not re.fullmatch(r"[0-9a-f]{40,64}", root[0]):
        raise RuntimeError(f"removing the history left no commit at HEAD: {out.strip()[-300:]!r}")
    return root[0]


def environ_for_git() -> dict[str, str]:
    """Variables that keep git and pagers non-interactive inside the sandbox."""
    return {"GIT_PAGER": "cat", "PAGER": "cat", "GIT_TERMINAL_PROMPT": "0", "GIT_EDITOR": "true", "EDITOR": "true"}
