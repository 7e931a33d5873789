"""SWE tasks: prepare the repository, tell the agent the issue, score with the hidden tests."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import anyio

from orchard_async import ConfigError, RecipeOptions, Reward, Sandbox, SandboxSpec, recipe_option
from orchard_async.images import ImageSpec
from orchard_async.recipes.swe import formats, scoring
from orchard_async.recipes.swe import repo as repos
from orchard_async.recipes.swe import swebench_harness as swebench
from orchard_async.recipes.swe.agent import INSTANCE_TEMPLATE
from orchard_async.recipes.swe.builtin import INSTANCES_PATH
from orchard_async.recipes.swe.instances import Instance, load_instances
from orchard_async.recipes.swe.swebench_harness import Activation

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
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}
# Third-party pytest plugins stay off where the recipe prepares the repository (the local
# adapter's interpreter is the controller's, with whatever plugins it has), unless the
# instance's env says otherwise: PYTEST_DISABLE_PLUGIN_AUTOLOAD set to "" (or "0") lets
# pytest load them. Instances in SWE-bench's images follow SWE-bench's spec, which leaves
# autoload on.
AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
PLUGINS_OFF = {AUTOLOAD: "1"}


class SweOptions(RecipeOptions):
    """The SWE recipe's options (``--recipe-options``, or keywords of ``load_tasks``)."""

    RECIPE: ClassVar[str] = "swe"

    ids: Annotated[tuple[str, ...] | None, recipe_option("only these instances (ids or repo names)")] = None
    max_steps: Annotated[int, recipe_option("agent turns per episode", ge=1)] = MAX_STEPS
    deadline: Annotated[
        float | None, recipe_option("seconds for the whole episode (default 600 for the bundled set, else 1800)")
    ] = None
    score_timeout: Annotated[
        float | None, recipe_option("seconds of the deadline kept for scoring (default 120 bundled, else 300)")
    ] = None
    exec_timeout: Annotated[float, recipe_option("seconds per agent command", gt=0)] = EXEC_TIMEOUT
    base_image: Annotated[
        str | None, recipe_option("the image for instances the recipe checks out itself (container adapters)")
    ] = IMAGE.tag
    strict: Annotated[bool, recipe_option("grade with the patch's changes to test configuration reverted")] = True
    image_namespace: Annotated[
        str,
        recipe_option(
            "namespace of SWE-bench's instance images (empty: SWE-bench's local names)",
            "ORCHARD_SWE_IMAGE_NAMESPACE",
            empty_is_value=True,
        ),
    ] = swebench.NAMESPACE
    image_registry: Annotated[
        str,
        recipe_option("registry in front of SWE-bench's image names (none by default)", "ORCHARD_SWE_IMAGE_REGISTRY"),
    ] = ""
    image_tag: Annotated[str, recipe_option("tag of SWE-bench's instance images", "ORCHARD_SWE_IMAGE_TAG")] = (
        swebench.TAG
    )
    pull: Annotated[
        Literal["missing", "never", "always"], recipe_option("the sandboxes' image pull policy", "ORCHARD_SWE_PULL")
    ] = "missing"
    image_map: Annotated[
        dict[str, str],
        recipe_option("a dataset's image names mapped to images here (any format: SWE-rebench-V2, Pro, ...)"),
    ] = {}
    pro_scripts: Annotated[
        str | None,
        recipe_option("SWE-bench Pro's run_scripts folder (default: run_scripts next to the dataset file)"),
    ] = None
    harness: Annotated[
        Literal["auto", "swebench", "pytest"],
        recipe_option(
            "who grades instances with SWE-bench's fields: auto (the swebench package when installed), swebench, pytest",
            "ORCHARD_SWE_HARNESS",
        ),
    ] = "auto"


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
    activation: Activation = field(default_factory=Activation)
    official: swebench.OfficialHarness | None = None  # SWE-bench's own grading, when it applies
    # Checkout and environment check are the same for every sample of a group: the engine
    # sets a group up once and starts its samples from a snapshot (orchard_async.engine.groups).
    fork_after_setup: bool = True
    # The one commit the agent's repository holds after setup (repo.drop_history): its tree is
    # the base's, and the same in every sandbox of the instance. The agent's diff is read
    # against it. None until a setup ran in this process.
    agent_base: str | None = field(default=None, init=False, repr=False)
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.instance.instance_id
        if self.score_timeout >= self.deadline:
            raise ConfigError(
                f"{self.id}: score_timeout ({self.score_timeout}s) must be less than the deadline ({self.deadline}s)"
            )

    @property
    def harness(self) -> scoring.Harness:
        """What runs and reads the tests: the row's publisher's way (SWE-bench Pro's scripts,
        a dataset's named log parser, SWE-bench's harness), else the recipe's pytest one."""
        inst = self.instance
        if inst.pro is not None:
            return scoring.ProTests(inst.pro)
        if inst.log_parser:
            return scoring.LogParserTests(self.test_command, inst.log_parser, self.activation)
        if self.official is not None:
            return scoring.OfficialTests(self.official, self.activation)
        return scoring.PytestHarness(self.test_command, self.activation)

    @property
    def in_image(self) -> bool:
        """The repository comes with the image (SWE-bench's and the other datasets' images)."""
        return self.spec.workdir is not None

    @property
    def test_command(self) -> str:
        return self.instance.test_command or self.instance.default_test_command()

    @property
    def environment(self) -> tuple:
        inst = self.instance
        return (
            self.spec.image,
            inst.repo,
            inst.repo_path,
            inst.enter_commands,
            tuple(inst.setup_commands),
            self.harness.key,
        )

    async def prepare(self, sandbox: Sandbox) -> None:
        """The repository at ``base_commit`` with the instance's setup done: the agent's
        sandbox and the scorer's are prepared alike."""
        inst = self.instance
        timeout = SETUP_TIMEOUT
        # An instance with an image (its own, or SWE-bench's by convention) has the repository there.
        for command in inst.enter_commands:  # the format's own first steps (a checkout of its commit)
            result = await sandbox.exec(command, timeout=timeout)
            if result.reason.is_infra or not result.ok:
                repos.check_result(result, f"entry command {command!r}")
        head = await repos.existing_checkout(sandbox, time_limit=60) if self.in_image else None
        if head is not None:
            await repos.adopt_checkout(sandbox, head, inst.base_commit, timeout)
        elif self.source is not None:
            pack = await self.source.pack(inst.base_commit)
            await repos.checkout(sandbox, pack, inst.base_commit, timeout)
        else:  # an image instance on an adapter that runs no image (local): nothing to check out from
            raise RuntimeError(
                f"{inst.instance_id}: the sandbox has no repository at its working directory (image {self.spec.image} "
                f"is only used by container adapters) and the instance has no repo_path to prepare one from"
            )
        for command in inst.setup_commands:
            result = await sandbox.exec(self.activation.wrap(command), timeout=timeout)
            if result.reason.is_infra or not result.ok:
                repos.check_result(result, f"setup command {command!r}")

    async def setup(self, sandbox: Sandbox) -> str:
        await self.prepare(sandbox)

        async def prove() -> float:
            return await scoring.prove_harness(
                sandbox, self.instance, harness=self.harness, time_limit=self.score_timeout
            )

        await self.proofs.ensure(self.environment, prove)
        # Last, after the proof (which stages the tests from the history): from here the
        # repository holds no commit but the base's tree, so the fix cannot be read from it.
        root = await repos.drop_history(sandbox, SETUP_TIMEOUT)
        if self.agent_base not in (None, root):
            raise RuntimeError(
                f"{self.id}: the base's tree committed as {root}, another sandbox's as {self.agent_base}"
            )
        self.agent_base = root
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
            return await scoring.submission(sandbox, self.agent_base or self.instance.base_commit, time_limit=60.0)
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
        callers that have only this sandbox. Its repository has no history left (setup drops
        it), so an instance whose tests are staged from a later commit (SWE-bench Pro's)
        cannot be graded here: a VerifierError."""
        patch = await self.submission(sandbox)
        base = self.agent_base or self.instance.base_commit
        if not patch.startswith(NO_DIFF):
            # An image's ignored files are its build products (compiled extensions, ...): kept there.
            clean = "git clean -qfd" if self.in_image else "git clean -qfdx"
            reset = f"{scoring.REPO_GUARD}\ngit reset -q --hard {base} && {clean}"
            repos.check_result(await sandbox.exec(reset, timeout=60.0), "resetting the tree to base")
        return await self._score(patch, sandbox, self.score_timeout, base)

    async def _score(self, submission: str, sandbox: Sandbox, budget: float, base: str | None = None) -> Reward:
        if submission.startswith(NO_DIFF):  # the agent broke its repository: its own failure
            info = {"instance_id": self.id, **scoring.grade(self.instance, {}), "error": "no diff"}
            return Reward(value=0.0, success=False, info={**info, "detail": submission[len(NO_DIFF) :]})
        # The scorer reverts the test files to the base: in the agent's own sandbox, its one commit.
        instance = self.instance if base is None else dataclasses.replace(self.instance, base_commit=base)
        return await scoring.score(
            sandbox, instance, submission, harness=self.harness, budget=budget, strict=self.strict
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
    source: str = "builtin", options: SweOptions | Mapping[str, Any] | None = None, **keywords: Any
) -> list[SWETask]:
    """The recipe's task loader (``--tasks``), with its options (``SweOptions``: a struct, a
    mapping or keywords; see ``RecipeOptions.resolve``).

    ``source`` is ``builtin`` (the bundled set), ``builtin:ID,REPO,...`` (a subset by
    instance id or repo name), or a ``.jsonl``/``.json`` file of SWE-bench-style
    instances. ``base_image`` is the image for instances the recipe checks out itself
    (container adapters need one with sh, git and the project's toolchain; local ignores it).

    An instance that names no image and has no repository source here (no ``repo_path``,
    no ``repos/<name>`` next to the file, no bundled repo of that name) runs in SWE-bench's
    image for its id (``swebench_harness.image_name``): ``image_namespace`` (default
    ``swebench``; ``""`` for SWE-bench's local names), ``image_registry`` (in front, none by
    default), ``image_tag`` (``latest``); ``pull`` is the sandboxes' pull policy (missing,
    never, always). Instances in SWE-bench's images get its environment (conda env
    ``testbed``) activated for the agent and the scorer, the repository at /testbed.

    ``harness``: ``auto`` (default) grades instances that carry SWE-bench's evaluation
    fields with the ``swebench`` package when it is installed, the rest with the recipe's
    pytest parser; ``swebench`` requires the package for them; ``pytest`` never uses it.
    The image and harness options not given are read from their ``ORCHARD_SWE_*`` variables.
    """
    opts = SweOptions.resolve(options, **keywords)
    namespace = opts.image_namespace or None
    registry = opts.image_registry or None
    tag = opts.image_tag or swebench.TAG
    pull, harness = opts.pull, opts.harness
    ids, strict, base_image = opts.ids, opts.strict, opts.base_image
    max_steps, exec_timeout = opts.max_steps, opts.exec_timeout
    if source == "builtin" or source.startswith("builtin:"):
        instances = load_instances(INSTANCES_PATH)
        search_dir = None
        wanted = [part for part in source.partition(":")[2].split(",") if part.strip()]
        if wanted:
            instances = _select(instances, [w.strip() for w in wanted])
        builtin = True
    else:
        prefix, colon, rest = source.partition(":")
        fmt = formats.PREFIXES.get(prefix) if colon else None
        path = Path(rest if fmt else source).expanduser()
        instances = load_instances(path, format=fmt, pro_scripts=opts.pro_scripts)
        search_dir = path.resolve().parent
        builtin = False
    if ids:
        instances = _select(instances, list(ids))
    # The bundled suites run in about a second: shorter limits find a hung episode sooner.
    deadline = opts.deadline or (600.0 if builtin else DEADLINE)
    score_timeout = opts.score_timeout or (120.0 if builtin else SCORE_TIMEOUT)
    use_swebench = harness == "swebench" or (harness == "auto" and swebench.usable())
    sources: dict[tuple[str, str | None], repos.RepoSource | None] = {}
    proofs = HarnessProofs()
    tasks = []
    for inst in instances:
        key = (inst.repo, inst.repo_path)
        if key not in sources:
            sources[key] = repos.find_source(inst.repo, inst.repo_path, search_dir)
        source_of = sources[key]
        image = inst.image
        if image is None and source_of is None:
            image = swebench.image_name(inst.instance_id, namespace=namespace, registry=registry, tag=tag)
        image = opts.image_map.get(image, image) if image else image
        activation = _activation(inst, image)
        if inst.log_parser:  # a parser the row names must exist before anything runs
            try:
                scoring.swebench_parser(inst.log_parser)
            except ConfigError as exc:
                raise ConfigError(f"{inst.where}: instance {inst.instance_id!r}: {exc}") from None
        official = None
        if use_swebench and harness != "pytest" and swebench.has_official_fields(inst):
            official = swebench.OfficialHarness.build(inst, image)
        spec = SandboxSpec(
            image=image or base_image,
            workdir=(inst.workdir or TESTBED) if image else None,
            env=_sandbox_env(inst, activation, plugins_off=not swebench.is_official_image(image)),
            labels={"orchard.recipe": "swe"},
            pull=pull,
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
                activation=activation,
                official=official,
            )
        )
    unofficial = [t.id for t in tasks if t.official is None and swebench.has_official_fields(t.instance)]
    if unofficial and harness == "auto":
        warnings.warn(
            f"{len(unofficial)} instance(s) carry SWE-bench's evaluation fields ({unofficial[0]}, ...) but swebench>="
            f"{swebench.MIN_VERSION} is not installed: the recipe's pytest harness grades them "
            "(pip install 'orchard-async[swebench]' to grade them as SWE-bench does)",
            stacklevel=2,
        )
    return tasks


def _activation(inst: Instance, image: str | None) -> Activation:
    """The instance's own ``activate`` prefix; else SWE-bench's conda env in its images (and
    SWE-smith's), unless the row's own eval script activates none."""
    if inst.activate:
        return Activation(prefix=inst.activate)
    if inst.format == formats.SMITH:  # SWE-smith's images are built as SWE-bench's: conda's testbed env
        return swebench.CONDA_TESTBED
    script = inst.extra.get("eval_script")
    if isinstance(script, str) and "conda activate" not in script:
        return Activation()  # a row whose own eval script uses no conda (Multilingual's Go, Rust, ...)
    if swebench.is_official_image(image):
        return swebench.CONDA_TESTBED
    return Activation()


def _sandbox_env(inst: Instance, activation: Activation, *, plugins_off: bool) -> dict[str, str]:
    env = {**SANDBOX_ENV, **(PLUGINS_OFF if plugins_off else {}), **activation.env, **inst.env}
    if env.get(AUTOLOAD, "").strip() in ("", "0"):  # pytest reads any non-empty value as "off"
        env.pop(AUTOLOAD, None)
    return env
