"""Each SWE dataset format run on docker as its publisher runs it: an image laid out as
the publisher's (tests/recipes/swe_format_rows.py: the repository at its path, its test
runner installed) built here with no registry, the row as published; the gold fix
resolves and the empty patch does not, graded by the publisher's rule (SWE-rebench-V2's
named log parser, Scale-SWE's f2p script, SWE-smith's branch and reversed bug patch, SWE-bench
Pro's run_script.sh + parser.py, a Multilingual Go row through swebench's parse_log_gotest).
An agent that reads the fix out of git (every commit object it can find) finds it in the
SWE-smith, Pro and Scale-SWE images as published, and nothing after the recipe's setup.
Needs a daemon and the recipe's image; the Go image installs golang-go from the apt mirror."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe import formats
from orchard_async.recipes.swe import swebench_harness as official
from tests.conftest import backend_missing, require_docker
from tests.recipes import swe_format_rows as rows

try:
    from orchard_async.adapters.docker import DockerAdapter
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)

# Five images (one with Go from the apt mirror) and ten episodes: the soak run.
pytestmark = pytest.mark.soak

BUILDERS = {
    formats.REBENCH: rows.rebench,
    formats.SCALE: rows.scale,
    formats.SMITH: rows.smith,
    formats.PRO: None,  # needs its run_scripts folder too
    "swe-bench-multilingual": rows.multilingual,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    require_docker(rows.BASE_IMAGE)
    made, images = {}, []
    for name, build in BUILDERS.items():
        folder = tmp_path_factory.mktemp(name)
        if build is None:
            row, image = rows.pro(folder / "context", folder / "run_scripts")
        else:
            row, image = build(folder / "context")
        rows.build(folder / "context", image)
        images.append(image)
        path = folder / "rows.jsonl"
        path.write_text(json.dumps(row) + "\n")
        made[name] = path
    yield made
    subprocess.run(["docker", "rmi", "-f", *images], capture_output=True, timeout=300)


async def on_docker(tasks: list, policy: object) -> list[oa.Trajectory]:
    adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")
    try:
        return [t async for t in oa.rollout(tasks, policy, adapter, concurrency=2)]
    finally:
        leaked = await adapter.list_owned()
        await adapter.close()
        assert leaked == []


HARNESS = {
    formats.REBENCH: "log-parser",
    formats.SCALE: "pytest",
    formats.SMITH: "log-parser",
    formats.PRO: "swe-bench-pro",
    "swe-bench-multilingual": "swebench",
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_gold_resolves_and_empty_does_not(built, name):
    if name == "swe-bench-multilingual" and not official.usable():
        backend_missing(f"swebench>={official.MIN_VERSION} is not installed: pip install -e '.[swebench]'")
    (task,) = swe.load_tasks(str(built[name]))
    gold, empty = anyio.run(lambda: _both(task))
    assert gold.status == "finished", gold.error
    assert gold.info["harness"] == HARNESS[name]
    assert gold.success, gold.info.get("test_output_tail", gold.info)
    assert set(gold.info["tests"].values()) == {"PASSED"}
    assert (empty.status, empty.success) == ("finished", False), empty.error
    f2p = [empty.info["tests"][test] for test in task.instance.FAIL_TO_PASS]
    assert "PASSED" not in f2p, empty.info["tests"]


async def _both(task) -> tuple[oa.Trajectory, oa.Trajectory]:
    (gold,) = await on_docker([task], swe.make_policy("oracle"))
    (empty,) = await on_docker([task], swe.make_policy("empty"))
    return gold, empty


def test_a_pro_agent_cannot_keep_its_own_version_of_the_tests(built):
    """Pro puts the test files in place from its gold commit: an agent's edit to them is gone."""
    from tests.recipes.swe_support import ScriptPolicy

    (task,) = swe.load_tasks(str(built[formats.PRO]))
    gut = "printf 'def test_chained_powers():\\n    pass\\n' > tests/test_evaluator.py"
    (cheat,) = anyio.run(on_docker, [task], ScriptPolicy([gut], name="rewrite-tests"))
    assert cheat.status == "finished" and not cheat.success, cheat.info


# An agent that reads the fix out of the repository's git data: every commit object there,
# reachable or not (branches, tags, reflogs, stashes, a gold commit's objects, loose or packed),
# diffed against HEAD outside the tests; the first whose code differs is applied.
HISTORY_THIEF = r"""head=$(git rev-parse HEAD)
for c in $(git cat-file --batch-all-objects --batch-check='%(objecttype) %(objectname)' | sed -n 's/^commit //p'); do
  [ "$c" = "$head" ] && continue
  git diff "$head" "$c" -- . ':(exclude)tests' > /tmp/stolen.patch
  if [ -s /tmp/stolen.patch ] && git apply /tmp/stolen.patch; then echo "applied the code of $c"; exit 0; fi
done
echo "no other code in the repository"
"""
# What the agent's repository holds: its commit objects, refs, reflogs and stashes.
INVENTORY = (
    "git cat-file --batch-all-objects --batch-check='%(objecttype)' | grep -c '^commit$'; "
    "git for-each-ref --format='%(refname)'; git reflog --all | wc -l; git stash list | wc -l; git remote | wc -l"
)
HOLES = [formats.SMITH, formats.PRO, formats.SCALE]  # their images as published keep the fix in git


def _fixed(instance) -> str:
    """Shell that prints FIXED when the gold fix is in the tree (its reverse applies)."""
    patch = instance.patch if instance.patch.endswith("\n") else instance.patch + "\n"
    flags = "" if instance.gold_reverse else "-R "
    return f"git apply --check {flags}<<'EOF' 2>/dev/null && echo FIXED\n{patch}EOF"


@pytest.mark.parametrize("name", HOLES)
def test_the_history_thief_finds_the_fix_in_the_image_as_published(built, name):
    """Control: in a container of the image entered as the format enters it (no recipe
    setup), the thief does find and apply the fix: the hole the recipe closes is real."""
    (task,) = swe.load_tasks(str(built[name]))
    script = "\n".join(
        [*task.instance.enter_commands, HISTORY_THIEF.replace("exit 0", ":; break"), _fixed(task.instance)]
    )
    done = subprocess.run(
        ["docker", "run", "--rm", "-i", "-w", task.spec.workdir, task.spec.image, "bash", "-s"],
        input=script, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "applied the code of" in done.stdout and done.stdout.rstrip().endswith("FIXED"), (done.stdout, done.stderr)


@pytest.mark.parametrize("name", HOLES)
def test_an_agent_finds_no_fix_in_its_repository(built, name):
    """After setup the agent's repository is one commit of the base's tree, no other ref,
    reflog, stash or remote: the thief finds nothing and the episode is not resolved."""
    from tests.recipes.swe_support import ScriptPolicy

    (task,) = swe.load_tasks(str(built[name]))
    (thief,) = anyio.run(on_docker, [task], ScriptPolicy([INVENTORY, HISTORY_THIEF, _fixed(task.instance)], "thief"))
    assert thief.status == "finished", thief.error
    inventory, stolen, fixed = (step.observation for step in thief.steps[:3])
    commits, *refs = inventory.split()
    assert commits == "1" and refs[:-3] in ([], ["refs/heads/" + task.instance.base_commit]), inventory
    assert refs[-3:] == ["0", "0", "0"], inventory  # reflog entries, stashes, remotes
    assert stolen.strip() == "no other code in the repository", stolen
    assert "FIXED" not in fixed
    assert (thief.success, thief.reward, thief.info["empty_patch"]) == (False, 0.0, True), thief.info
