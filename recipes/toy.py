"""A built-in toy task set, so the main job runs with nothing else installed.

Five small shell chores with programmatic scoring, each in a few seeded variants, and
scripted policies: ``oracle`` (solves every task in a few steps), ``random`` (plausible
commands, usually wrong), ``empty`` (submits at once) and ``noisy-oracle:P`` (the oracle
with probability P per episode, else empty; see ``orchard_async.recipes``). Built only on
the public core API, like every recipe. Options (``ToyOptions``): how many variants, the
random policy's seed.

Its training data (``orchard-async export``) is a shell agent's chat (``toy_messages``): the
recipe's system prompt, the task, each command as a reply in a ``bash`` block and its
output, then ``submit``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from orchard_async import (
    Action,
    ConfigError,
    Observation,
    Policy,
    RecipeOptions,
    Reward,
    Sandbox,
    SandboxSpec,
    Trajectory,
    recipe_option,
)
from orchard_async.recipes import noisy_oracle
from orchard_async.records.export import Chats


class ToyOptions(RecipeOptions):
    """The toy recipe's options (``--recipe-options``, or keywords of ``load_tasks`` and ``make_policy``)."""

    RECIPE: ClassVar[str] = "toy"

    variants: Annotated[int, recipe_option("seeded variants of each of the five chores", ge=1)] = 2
    seed: Annotated[int, recipe_option("the random policy's seed")] = 0


SYSTEM_PROMPT = (
    "You are an agent in a Linux shell. Do the task you are given with shell commands: reply with exactly "
    "one command in a ```bash block, and you see its output. When the task is done, reply with `submit` in a "
    "```bash block."
)
OBSERVATION_CHARS = 10_000


@dataclass
class ShellTask:
    """A task given as files to create, an instruction, a scorer and a known solution."""

    id: str
    instruction: str
    files: dict[str, str]
    check: Callable[[Sandbox], object]  # async (sandbox) -> bool
    solution: list[str]
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    max_steps: int = 10
    deadline: float = 120.0
    score_timeout: float = 20.0
    exec_timeout: float = 30.0

    async def setup(self, sandbox: Sandbox) -> str:
        for path, text in self.files.items():
            await sandbox.write_file(path, text, mode=0o755 if path.endswith(".sh") else 0o644)
        return self.instruction

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        passed = bool(await self.check(sandbox))  # type: ignore[misc]
        return Reward(value=1.0 if passed else 0.0, success=passed)


async def _file_equals(sandbox: Sandbox, path: str, expected: str) -> bool:
    try:
        return (await sandbox.read_file(path)).decode(errors="replace").strip() == expected
    except FileNotFoundError:
        return False


def _sum_task(seed: int) -> ShellTask:
    rng = random.Random(seed)
    files = {
        f"data/part{i}.txt": "\n".join(str(rng.randint(1, 999)) for _ in range(rng.randint(3, 8))) + "\n"
        for i in range(3)
    }
    total = sum(int(x) for text in files.values() for x in text.split())
    return ShellTask(
        id=f"sum-{seed}",
        instruction="Write the sum of all the numbers in the files under data/ into answer.txt.",
        files=files,
        check=lambda sb: _file_equals(sb, "answer.txt", str(total)),
        solution=["ls data", "cat data/*.txt | awk '{s+=$1} END {print s}' > answer.txt", "cat answer.txt"],
    )


def _fix_script_task(seed: int) -> ShellTask:
    rng = random.Random(seed)
    name = rng.choice(["world", "orchard", "sandbox", "agent"])
    broken = f'#!/bin/sh\ngreeting="hello"\ntarget="{name}"\necho "$greting $target"\n'

    async def check(sb: Sandbox) -> bool:
        result = await sb.exec("sh greet.sh", timeout=10)
        return result.ok and result.text.strip() == f"hello {name}"

    return ShellTask(
        id=f"fix-script-{seed}",
        instruction=f"greet.sh should print 'hello {name}' but it does not. Fix the script.",
        files={"greet.sh": broken},
        check=check,
        solution=["sh greet.sh", "sed -i 's/\\$greting/$greeting/' greet.sh", "sh greet.sh"],
    )


def _count_errors_task(seed: int) -> ShellTask:
    rng = random.Random(seed)
    levels = [rng.choice(["INFO", "WARN", "ERROR", "DEBUG"]) for _ in range(rng.randint(20, 40))]
    log = "".join(f"2026-12-0{i % 9 + 1} {level} event {i}\n" for i, level in enumerate(levels))
    return ShellTask(
        id=f"count-errors-{seed}",
        instruction="Count the lines of app.log that have level ERROR and write the number into errors.txt.",
        files={"app.log": log},
        check=lambda sb: _file_equals(sb, "errors.txt", str(levels.count("ERROR"))),
        solution=["head -3 app.log", "grep -c ' ERROR ' app.log > errors.txt"],
    )


def _sort_names_task(seed: int) -> ShellTask:
    rng = random.Random(seed)
    pool = ["ada", "grace", "linus", "guido", "barbara", "ken", "dennis", "margaret", "alan", "edsger"]
    names = [rng.choice(pool) for _ in range(15)]
    return ShellTask(
        id=f"sort-names-{seed}",
        instruction="names.txt has one name per line, with repeats. Write the distinct names, sorted, one per line, into sorted.txt.",
        files={"names.txt": "\n".join(names) + "\n"},
        check=lambda sb: _file_equals(sb, "sorted.txt", "\n".join(sorted(set(names)))),
        solution=["sort -u names.txt > sorted.txt", "cat sorted.txt"],
    )


def _tree_task(seed: int) -> ShellTask:
    rng = random.Random(seed)
    parts = [rng.choice(["src", "lib", "pkg"]), rng.choice(["core", "util", "io"]), rng.choice(["a", "b", "c"])]
    path = "/".join(parts) + "/READY"
    return ShellTask(
        id=f"make-tree-{seed}",
        instruction=f"Create the file {path} (with any missing directories) containing the single word done.",
        files={},
        check=lambda sb: _file_equals(sb, path, "done"),
        solution=[f"mkdir -p {'/'.join(parts)}", f"echo done > {path}"],
    )


def builtin_tasks(variants: int = 2) -> list[ShellTask]:
    makers = [_sum_task, _fix_script_task, _count_errors_task, _sort_names_task, _tree_task]
    return [make(seed) for seed in range(variants) for make in makers]


class OraclePolicy:
    """Plays each task's known solution, then submits."""

    name = "oracle"

    async def act(self, observation: Observation) -> Action:
        solution = getattr(observation.task, "solution", [])
        if observation.step < len(solution):
            return Action(command=solution[observation.step])
        return Action(kind="submit")


class RandomPolicy:
    """Plausible commands, chosen at random per episode (seeded by its id): usually wrong."""

    name = "random"
    COMMANDS = [
        "ls -la",
        "cat *.txt | head",
        "echo 42 > answer.txt",
        "wc -l *",
        "echo done > READY",
        "sort names.txt > sorted.txt",
        "grep -c INFO app.log > errors.txt",
        "sh greet.sh",
        "mkdir -p src",
        "true",
    ]

    def __init__(self, seed: int = 0):
        self.seed = seed

    async def act(self, observation: Observation) -> Action:
        rng = random.Random(f"{self.seed}/{observation.episode_id}/{observation.step}")
        if observation.step >= 3 and rng.random() < 0.4:
            return Action(kind="submit")
        return Action(command=rng.choice(self.COMMANDS))


class EmptyPolicy:
    """Submits at once: every task scores 0."""

    name = "empty"

    async def act(self, observation: Observation) -> Action:
        return Action(kind="submit")


POLICIES = {"oracle": OraclePolicy, "random": RandomPolicy, "empty": EmptyPolicy}
OPTIONS = ToyOptions  # what `--recipe-options` takes


def load_tasks(
    source: str = "builtin", options: ToyOptions | Mapping[str, Any] | None = None, **keywords: Any
) -> list[ShellTask]:
    """The recipe's task loader (`--tasks`): only the built-in set exists for the toy recipe."""
    opts = ToyOptions.resolve(options, **keywords)
    if source != "builtin":
        raise ConfigError(f"the toy recipe has only built-in tasks; got --tasks {source!r}")
    return builtin_tasks(opts.variants)


def make_policy(name: str, options: ToyOptions | Mapping[str, Any] | None = None, **keywords: Any) -> Policy:
    opts = ToyOptions.resolve(options, **keywords)
    if name == "random":
        return RandomPolicy(opts.seed)
    noisy = noisy_oracle(name, OraclePolicy(), EmptyPolicy())
    if noisy is not None:
        return noisy
    if name not in POLICIES:
        choices = ", ".join([*POLICIES, "noisy-oracle:P"])
        raise ConfigError(f"unknown policy {name!r} for the toy recipe; choose one of: {choices}")
    return POLICIES[name]()


def toy_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """An episode as a shell agent's chat: what a model acting through this recipe would see."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": trajectory.instruction}]
    for step in trajectory.steps:
        if step.action.kind == "submit":
            messages.append({"role": "assistant", "content": "```bash\nsubmit\n```"})
        elif step.action.kind == "exec":
            messages.append({"role": "assistant", "content": f"```bash\n{step.action.command}\n```"})
            output = step.observation or f"(no output; exit status {step.exit_code})"
            messages.append({"role": "user", "content": output[:OBSERVATION_CHARS]})
    return messages


def training_chats(options: dict[str, Any]) -> Chats:
    """The toy recipe's chat for ``orchard-async export``."""
    return Chats(toy_messages)
