"""SWE tasks: prepare the repository, tell the agent the issue, score with the hidden tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from orchard_async import ConfigError, Reward, Sandbox, SandboxSpec
from orchard_async.images import ImageSpec

from . import repo as repos
from . import scoring
from .agent import INSTANCE_TEMPLATE
from .builtin import INSTANCES_PATH
from .instances import Instance, load_instances

# Defaults sized for real repositories; the bundled set's suites take about a second.
MAX_STEPS = 50
DEADLINE = 1800.0  # seconds for the whole episode: setup, agent turns and scoring
SCORE_TIMEOUT = 300.0  # of the deadline, kept for scoring
EXEC_TIMEOUT = 120.0  # per agent command
SETUP_TIMEOUT = 300.0  # checkout and setup commands
TESTBED = "/testbed"  # where SWE-bench images keep the repository
# What SWE sandboxes need: sh, git, python with pytest. Container adapters get it from this
# image (`orchard-async images build`); the local adapter gives its sandboxes the
# controller's own interpreter, which has pytest (a dependency of this package).
IMAGE = ImageSpec(
    tag="orchard/swe-python:bookworm", base="debian-minbase", apt_packages=("python3", "python3-pytest", "git", "patch")
)

SANDBOX_ENV = {
    **repos.environ_for_git(),
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


class HarnessProofs:
    """Which environments have shown that their test command runs (see scoring.prove_harness).

    Keyed by what decides whether the harness can run: image, repository, setup and test
    command. One proof per key per process; concurrent episodes wait for the first."""

    def __init__(self) -> None:
        self.proven: dict[tuple, float] = {}
        self._locks: dict[tuple, anyio.Lock] = {}

    async def ensure(self, key: tuple, prove) -> None:  # prove: () -> Awaitable[float]
        if key in self.proven:
            return
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self.proven:
                self.proven[key] = await prove()


@dataclass(eq=False)
class SWETask:
    """One SWE-bench-style instance as an orchard-async Task, graded apart: the agent's
    patch is scored in a clean sandbox (see scoring). ``strict`` grades with the patch's
    changes to test configuration reverted (the default; they are flagged either way)."""

    instance: Instance
    source: repos.RepoSource | None
    spec: SandboxSpec
    max_steps: int = MAX_STEPS
    deadline: float = DEADLINE
    score_timeout: float = SCORE_TIMEOUT
    exec_timeout: float = EXEC_TIMEOUT
    strict: bool = True
    proofs: HarnessProofs = field(default_factory=HarnessProofs, repr=False)
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.instance.instance_id
        if self.score_timeout >= self.deadline:
            raise ConfigError(
                f"{self.id}: score_timeout ({self.score_timeout}s) must be less than the deadline ({self.deadline}s)"
            )

    @property
    def test_command(self) -> str:
        return self.instance.test_command or self.instance.default_test_command()

    @property
    def environment(self) -> tuple:
        inst = self.instance
        return (self.spec.image, inst.repo, inst.repo_path, tuple(inst.setup_commands), self.test_command)

    async def prepare(self, sandbox: Sandbox) -> None:
        """The repository at ``base_commit`` with the instance's setup done: the agent's
        sandbox and the scorer's are prepared alike."""
        inst = self.instance
        timeout = SETUP_TIMEOUT
        head = await repos.existing_checkout(sandbox, time_limit=60) if inst.image else None
        if head is not None:
            await repos.adopt_checkout(sandbox, head, inst.base_commit, timeout)
        elif self.source is not None:
            bundle = await self.source.bundle(inst.base_commit)
            await repos.checkout(sandbox, bundle, inst.base_commit, timeout)
        else:  # an image instance on an adapter that runs no image (local): nothing to check out from
            raise RuntimeError(
                f"{inst.instance_id}: the sandbox has no repository at its working directory (image {inst.image} "
                f"is only used by container adapters) and the instance has no repo_path to prepare one from"
            )
        for command in inst.setup_commands:
            result = await sandbox.exec(command, timeout=timeout)
            if result.reason.is_infra or not result.ok:
                repos.check_result(result, f"setup command {command!r}")

    async def setup(self, sandbox: Sandbox) -> str:
        await self.prepare(sandbox)

        async def prove() -> float:
            return await scoring.prove_harness(
                sandbox, self.instance, test_command=self.test_command, time_limit=self.score_timeout
            )

        await self.proofs.ensure(self.environment, prove)
        return INSTANCE_TEMPLATE.format(
            problem_statement=self.instance.problem_statement.strip(),
            repo=self.instance.repo,
            workdir=getattr(sandbox, "workdir", "."),
            short_commit=self.instance.base_commit[:12],
            exec_timeout=self.exec_timeout,
            max_steps=self.max_steps,
        )

    async def submission(self, sandbox: Sandbox) -> str:
        """The agent's patch; a repository the agent broke beyond diffing yields none."""
        try:
            return await scoring.submission(sandbox, self.instance.base_commit, time_limit=60.0)
        except RuntimeError as exc:
            return f"{NO_DIFF}{exc}"

    async def grade(self, submission: str, sandbox: Sandbox) -> Reward:
        start = time.monotonic()
        if not submission.startswith(NO_DIFF):
            await self.prepare(sandbox)
        reward = await self._score(submission, sandbox, self.score_timeout - (time.monotonic() - start))
        reward.info["score_s"] = round(time.monotonic() - start, 3)
        return reward

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        """Grade in the agent's own sandbox, its tree reset to base first. Weaker than the
        clean sandbox the episode loop uses (what the agent left running still runs): for
        callers that have only this sandbox."""
        patch = await self.submission(sandbox)
        if not patch.startswith(NO_DIFF):
            reset = f"{scoring.REPO_GUARD}\ngit reset -q --hard {self.instance.base_commit} && git clean -qfdx"
            repos.check_result(await sandbox.exec(reset, timeout=60.0), "resetting the tree to base")
        return await self._score(patch, sandbox, self.score_timeout)

    async def _score(self, submission: str, sandbox: Sandbox, budget: float) -> Reward:
        if submission.startswith(NO_DIFF):  # the agent broke its repository: its own failure
            info = {"instance_id": self.id, **scoring.grade(self.instance, {}), "error": "no diff"}
            return Reward(value=0.0, success=False, info={**info, "detail": submission[len(NO_DIFF) :]})
        return await scoring.score(
            sandbox, self.instance, submission, test_command=self.test_command, budget=budget, strict=self.strict
        )


NO_DIFF = "@@orchard:no-diff@@ "  # marks a submission that could not be read (never a real diff's start)


def _select(instances: list[Instance], wanted: list[str]) -> list[Instance]:
    """Instances whose id or repo is in ``wanted``, in file order; unknown names are an error."""
    known = {i.instance_id for i in instances} | {i.repo for i in instances}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ConfigError(f"no instance or repo named {', '.join(map(repr, unknown))}; have {', '.join(sorted(known))}")
    return [i for i in instances if i.instance_id in wanted or i.repo in wanted]


def load_tasks(
    source: str = "builtin",
    *,
    ids: list[str] | None = None,
    max_steps: int = MAX_STEPS,
    deadline: float | None = None,
    score_timeout: float | None = None,
    exec_timeout: float = EXEC_TIMEOUT,
    base_image: str | None = IMAGE.tag,
    strict: bool = True,
) -> list[SWETask]:
    """The recipe's task loader (``--tasks``).

    ``source`` is ``builtin`` (the bundled set), ``builtin:ID,REPO,...`` (a subset by
    instance id or repo name), or a ``.jsonl``/``.json`` file of SWE-bench-style
    instances. ``base_image`` is the image for instances that name none (container
    adapters need one with sh, git and the project's toolchain; local ignores it).
    """
    if source == "builtin" or source.startswith("builtin:"):
        instances = load_instances(INSTANCES_PATH)
        search_dir = None
        wanted = [part for part in source.partition(":")[2].split(",") if part.strip()]
        if wanted:
            instances = _select(instances, [w.strip() for w in wanted])
        builtin = True
    else:
        path = Path(source).expanduser()
        instances = load_instances(path)
        search_dir = path.resolve().parent
        builtin = False
    if ids:
        instances = _select(instances, ids)
    # The bundled suites run in about a second: shorter limits find a hung episode sooner.
    deadline = deadline or (600.0 if builtin else DEADLINE)
    score_timeout = score_timeout or (120.0 if builtin else SCORE_TIMEOUT)
    sources: dict[tuple[str, str | None], repos.RepoSource | None] = {}
    proofs = HarnessProofs()
    tasks = []
    for inst in instances:
        key = (inst.repo, inst.repo_path)
        if key not in sources:
            sources[key] = repos.find_source(inst.repo, inst.repo_path, search_dir)
        source_of = sources[key]
        if source_of is None and not inst.image:
            raise ConfigError(
                f"{inst.where}: instance {inst.instance_id!r}: no repository source for repo {inst.repo!r}: give "
                f"repo_path, put a git checkout or bundle at repos/{inst.repo.replace('/', '__')}[.bundle] next to "
                f"the instances file, or name an image with the repository at {TESTBED}"
            )
        spec = SandboxSpec(
            image=inst.image or base_image,
            workdir=TESTBED if inst.image else None,
            env={**SANDBOX_ENV, **inst.env},
            labels={"orchard.recipe": "swe"},
        )
        tasks.append(
            SWETask(
                inst,
                source_of,
                spec,
                max_steps=max_steps,
                deadline=deadline,
                score_timeout=score_timeout,
                exec_timeout=exec_timeout,
                strict=strict,
                proofs=proofs,
            )
        )
    return tasks
