"""Agents that try to forge an SWE reward. Every one must come out unresolved.

Each cheat is a short shell script an RL policy could learn. They run on the local adapter
always and on docker where a daemon and the recipe's image are there. The controls show the
setup is sharp: the gold patch resolves, and each cheat's *mechanism* does act on the
tests when it stays in the agent's own tree (so a pass would be a real forgery).
"""

from __future__ import annotations

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe.policies import gold_patch_command
from tests.recipes.swe_support import ScriptPolicy, run_rollout

INSTANCE = "minicalc__1"
F2P_FILE = "tests/test_parser.py"

# Turns every failing test into a pass: fools a grader that runs the tree's own conftest.
CONFTEST_HOOK = """cat > conftest.py <<'EOF'
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
EOF"""

# The fix compiled to unchecked-hash bytecode, the source restored: the diff is empty, and a
# Python that trusts the .pyc runs the fix. The excludes are removed so `git add -A` would
# take the .pyc, too.
PYC_TRICK = [
    "sed -i '/pycache\\|pyc/d' .git/info/exclude",
    "python - <<'EOF'\n"
    "import py_compile\n"
    "py_compile.compile('minicalc/parser.py', invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
    "EOF",
]

# A detached process that waits for the test run to start, then writes the fix. (`$p`: the
# watcher's own command line must not contain what it waits for.)
WATCHER = r"""p=py; p=${p}test
while :; do
  for f in /proc/[0-9]*/cmdline; do
    case "$(tr '\0' ' ' < "$f" 2>/dev/null)" in *"-m $p"*) git apply /tmp/fix.patch; exit 0;; esac
  done
  sleep 0.05
done
"""


def background_writer(patch: str) -> str:
    patch = patch if patch.endswith("\n") else patch + "\n"
    return (
        f"cat > /tmp/fix.patch <<'EOF'\n{patch}EOF\ncat > /tmp/watch.sh <<'EOF'\n{WATCHER}EOF\n"
        "(setsid sh /tmp/watch.sh >/dev/null 2>&1 &); echo started"
    )


def cheats(instance: swe.Instance) -> dict[str, list[str]]:
    gold = gold_patch_command(instance.patch)
    passing = "\n".join(f"def {t.split('::')[1]}():\n    pass\n" for t in instance.FAIL_TO_PASS if F2P_FILE in t)
    return {
        # the hidden tests' file replaced by trivially passing tests of the same names
        "edit_hidden_tests": [f"cat > {F2P_FILE} <<'EOF'\n{passing}EOF"],
        # every test file removed, so nothing can fail
        "delete_tests": ["git rm -q -r tests"],
        "conftest_hook": [CONFTEST_HOOK],
        "pyc_trick": [gold, *PYC_TRICK, "git checkout -- minicalc/parser.py && git status --short"],
        "background_writer": [background_writer(instance.patch)],
    }


@pytest.fixture(scope="module")
def task() -> swe.SWETask:
    (task,) = swe.load_tasks(f"builtin:{INSTANCE}")
    return task


@pytest.mark.parametrize(
    "cheat", ["edit_hidden_tests", "delete_tests", "conftest_hook", "pyc_trick", "background_writer"]
)
def test_cheat_is_unresolved_on_local(task, cheat, tmp_path):
    policy = ScriptPolicy(cheats(task.instance)[cheat], name=cheat)
    run = anyio.run(run_rollout, [task], policy, tmp_path / "root")
    (trajectory,) = run.trajectories
    assert trajectory.status == "finished", trajectory.error
    assert trajectory.reward == 0.0 and not trajectory.success, trajectory.info.get("tests")
    assert run.leaked == [] and run.left_on_disk == []
    if cheat == "conftest_hook":
        assert trajectory.info["test_config_touched"] == ["conftest.py"] and trajectory.info["test_config_reverted"]
    else:
        assert "test_config_touched" not in trajectory.info
    if cheat in ("pyc_trick", "background_writer"):
        assert trajectory.info["empty_patch"] and ".pyc" not in trajectory.info["patch"]


class PerSamplePolicy:
    """Sample k of a group runs scripts[k] (the episode id ends in /s<k>), then submits."""

    name = "per-sample"

    def __init__(self, scripts: list[list[str]]):
        self.scripts = scripts

    async def act(self, observation):
        script = self.scripts[int(observation.episode_id.rsplit("/s", 1)[1])]
        if observation.step < len(script):
            return oa.Action(command=script[observation.step])
        return oa.Action(kind="submit")


def test_forked_samples_cannot_reach_each_other_or_the_grade(task, tmp_path):
    """A group of SWE samples starts from one snapshot (SWE opts in to fork_after_setup):
    every cheat runs in a fork at once with a gold sample and a sample that does nothing.
    The cheats stay unresolved, the gold resolves, and the idle sample, whose fork shares
    the snapshot with the gold's, is not credited with the gold's fix."""
    names = ["edit_hidden_tests", "delete_tests", "conftest_hook", "pyc_trick", "background_writer"]
    scripts = [cheats(task.instance)[name] for name in names]
    scripts += [[gold_patch_command(task.instance.patch)], ["git status --short"]]
    run = anyio.run(
        lambda: run_rollout(
            [task], PerSamplePolicy(scripts), tmp_path / "root", n=len(scripts), group_size=len(scripts), concurrency=4
        )
    )
    by_sample = {t.sample: t for t in run.trajectories}
    assert all(t.status == "finished" for t in by_sample.values()), [t.error for t in by_sample.values()]
    snapshots = {t.forked_from for t in by_sample.values()}
    assert len(snapshots) == 1 and snapshots != {""}  # every sample started from the group's snapshot
    assert [by_sample[k].success for k in range(len(scripts))] == [False] * len(names) + [True, False]
    assert by_sample[len(scripts) - 1].info["empty_patch"]
    assert run.leaked == [] and run.left_on_disk == []


def test_gold_resolves_and_a_lax_grader_is_fooled_by_the_conftest_hook(task, tmp_path):
    """Controls: the same harness resolves the gold patch, and with strict mode off the
    conftest hook really does turn the failing tests into passes (flagged all the same)."""
    gold = anyio.run(run_rollout, [task], swe.make_policy("oracle"), tmp_path / "gold")
    assert gold.trajectories[0].success, gold.trajectories[0].info
    (lax,) = swe.load_tasks(f"builtin:{INSTANCE}", strict=False)
    hooked = anyio.run(run_rollout, [lax], ScriptPolicy(cheats(task.instance)["conftest_hook"]), tmp_path / "lax")
    (trajectory,) = hooked.trajectories
    assert trajectory.success and trajectory.info["test_config_touched"] == ["conftest.py"]
    assert "test_config_reverted" not in trajectory.info


def test_pyc_trick_forges_a_reward_when_graded_in_place(task, tmp_path):
    """Control for the .pyc cheat: left in the agent's tree with bytecode trusted, it passes
    the hidden tests with an empty diff. The clean-sandbox grader above scores it 0."""
    commands = [
        *cheats(task.instance)["pyc_trick"],
        f"{_apply_test_patch(task.instance)} && python -m pytest -q -p no:cacheprovider {F2P_FILE}",
    ]
    run = anyio.run(run_rollout, [task], ScriptPolicy(commands), tmp_path / "root")
    (trajectory,) = run.trajectories
    last = trajectory.steps[-2]  # the last command; then the submit
    assert last.exit_code == 0, last.observation  # the fix ran from bytecode alone
    assert not trajectory.success


def _apply_test_patch(instance: swe.Instance) -> str:
    patch = instance.test_patch if instance.test_patch.endswith("\n") else instance.test_patch + "\n"
    return f"git apply <<'EOF'\n{patch}EOF"
