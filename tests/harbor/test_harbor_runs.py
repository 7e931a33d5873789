"""The fixture set through the recipe: the oracle solves every task, the empty policy none, and
agents that try to forge a Harbor reward get nothing (docker here; local and kubernetes as
their adapters give Harbor's absolute paths and users).

The controls: the oracle scores 1.0 on the same tasks (the verifier can reward), and each
cheat's mechanism is shown acting in the agent's sandbox before it is scored.
"""

from __future__ import annotations

import anyio
import pytest

from orchard_async.recipes import harbor
from tests.harbor.support import BAD, ScriptPolicy, fixture_server, load, ready, run_groups, run_sync

SOLVED_EVERYWHERE = {
    "docker-image", "dockerfile-build", "env-health", "hello-legacy", "multi-step", "no-network", "reward-json",
    "separate-verifier", "workdir",
}  # fmt: skip
# Tasks whose users the adapter cannot switch to: none (a task with users asks for
# SandboxSpec.switch_users; a local sandbox has one unprivileged user, which every phase runs as).
NEEDS_USER_SWITCH: dict[str, set[str]] = {"docker": set(), "local": set(), "kubernetes": set()}

PLANTED = "echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json"
FORGED_TEST = "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n"
CHEATS = {
    # a reward file written before the verifier runs
    "prewritten_reward": [f"mkdir -p /logs/verifier && {PLANTED} && cat /logs/verifier/reward.txt"],
    # the test script the verifier would run, written ahead of it
    "tampered_test": [
        f"mkdir -p /tests && printf '{FORGED_TEST}' > /tests/test.sh && chmod +x /tests/test.sh && echo ok"
    ],
    # a detached process that keeps planting the reward and overwriting the test while the verifier runs
    "background_writer": [
        "cat > /tmp/w.sh <<'EOF'\nwhile :; do mkdir -p /logs/verifier /tests; "
        f"{PLANTED}; printf '{FORGED_TEST}' > /tests/test.sh; chmod +x /tests/test.sh; sleep 0.01; done\nEOF\n"
        # proof it runs: the reward it planted is seen (a read may fall between its truncate and write)
        "(setsid sh /tmp/w.sh >/dev/null 2>&1 &); i=0; until grep -qx 1 /logs/verifier/reward.txt 2>/dev/null; do "
        "i=$((i+1)); [ $i -gt 500 ] && break; sleep 0.02; done; [ $i -le 500 ] && echo 1 || echo never",
    ],
    # a process tree that respawns: each child plants the reward a little later
    "respawner": [
        "(setsid sh -c 'while :; do (sleep 0.3; "
        + PLANTED.replace("'", "'\\''")
        + ") & sleep 0.02; done' >/dev/null 2>&1 &); echo started"
    ],
    # the oracle's folder rewritten to plant the reward
    "modified_solution": [
        f"mkdir -p /solution && printf '#!/bin/sh\\n{PLANTED}\\n' > /solution/solve.sh && chmod +x /solution/solve.sh "
        "&& sh /solution/solve.sh && cat /logs/verifier/reward.txt"
    ],
}
# Graded apart: a symlink among the artifacts, and where the agent can replace the tar that
# packs them (root in a container), a tar that smuggles a python3 into the verifier's PATH.
SMUGGLER = (
    "ln -s /etc /logs/artifacts/escape && mkdir -p /tmp/s/app /tmp/s/usr/local/bin && "
    "echo '{\"primes\": [4]}' > /tmp/s/app/report.json && cp /tmp/s/app/report.json /app/report.json && "
    "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /tmp/s/usr/local/bin/python3 && "
    "chmod +x /tmp/s/usr/local/bin/python3 && "
    "if [ -w /usr/local/bin ]; then printf '#!/bin/sh\\nexec /bin/tar czf /tmp/.orchard-harbor-artifacts.tgz -C /tmp/s "
    "app usr\\n' > /usr/local/bin/tar && chmod +x /usr/local/bin/tar; fi; echo smuggled"
)
ADAPTERS = [pytest.param("local", id="local"), pytest.param("docker", id="docker")]
# The fixture set on the CI cluster: new pods per episode and phase, soak only.
KUBERNETES = pytest.param("kubernetes", id="kubernetes", marks=pytest.mark.soak)


@pytest.mark.soak
@pytest.mark.parametrize("adapter", [*ADAPTERS, KUBERNETES])
def test_oracle_solves_every_fixture_and_empty_none(adapter):
    ready(adapter)
    with fixture_server():  # what the no-network task must not reach (read as the tasks load)
        tasks = load()
        oracle = run_sync(tasks, harbor.make_policy("oracle"), adapter)
        empty = run_sync(tasks, harbor.make_policy("empty"), adapter)
    unswitched = NEEDS_USER_SWITCH[adapter]
    assert {t for t, traj in oracle.items() if traj.reward == 1.0 and traj.success} == SOLVED_EVERYWHERE | (
        {"agent-user"} - unswitched
    ), {t: (traj.reward, traj.end_reason, traj.error, traj.info) for t, traj in oracle.items() if traj.reward != 1.0}
    for name in unswitched:
        assert oracle[name].end_reason == "task_error" and "cannot switch to it" in oracle[name].error
    assert all(traj.reward == 0.0 and not traj.success for traj in empty.values()), {
        t: (traj.reward, traj.error) for t, traj in empty.items()
    }
    assert oracle["reward-json"].info["rewards"] == {"reward": 1.0, "length": 1.0, "executable": 1.0}
    assert empty["reward-json"].info["rewards"] == {"reward": 0.0, "length": 0.0, "executable": 0.0}
    assert oracle["multi-step"].info["steps"] == {"create": {"reward": 1.0}, "extend": {"reward": 1.0}}
    assert set(empty["multi-step"].info["steps"]) == {"create"}  # min_reward stopped the later step
    assert "/app/report.json" in oracle["separate-verifier"].info["artifacts"]


class EachGroupItsScript:
    """Group ``g`` of the rollout runs ``scripts[g]`` (episode ids are ``TASK/gN/sM``)."""

    name = "cheats"

    def __init__(self, scripts: list[list[str] | None]):
        self.scripts = scripts

    async def act(self, observation):
        group = int(observation.episode_id.split("/")[-2][1:])
        script = self.scripts[group]
        if script is None:
            return await harbor.make_policy("oracle").act(observation)
        return await ScriptPolicy(script).act(observation)


@pytest.mark.parametrize("adapter", [*ADAPTERS[:1], pytest.param("docker", id="docker", marks=pytest.mark.soak)])
def test_cheats_score_nothing(adapter):
    ready(adapter)
    hello, separate = load(ids=["hello-legacy"])[0], load(ids=["separate-verifier"])[0]
    names = [*CHEATS, "oracle", "smuggler"]
    scripts = [*CHEATS.values(), None, [SMUGGLER]]
    tasks = [hello] * (len(names) - 1) + [separate]
    found = anyio.run(lambda: run_groups(tasks, EachGroupItsScript(scripts), adapter))
    runs = dict(zip(names, found, strict=True))
    assert runs["oracle"].reward == 1.0  # control: this verifier does reward a solved task
    for name in CHEATS:
        trajectory = runs[name]
        assert trajectory.end_reason == "submitted", (name, trajectory.error)
        assert trajectory.steps[0].exit_code == 0, (name, trajectory.steps[0].observation)
        assert trajectory.reward == 0.0 and not trajectory.success, (name, trajectory.info)
    for name in ("prewritten_reward", "background_writer", "modified_solution"):  # the mechanism acted
        assert runs[name].steps[0].observation.strip().endswith("1"), name
    trajectory = runs["smuggler"]
    assert trajectory.steps[0].observation.strip() == "smuggled"
    refused = set(trajectory.info["artifacts_refused"])
    assert trajectory.reward == 0.0 and refused and refused <= {"logs/artifacts/escape", "usr/local/bin/python3"}


@pytest.mark.parametrize("adapter", [*ADAPTERS[:1], pytest.param("docker", id="docker", marks=pytest.mark.soak)])
def test_a_bad_reward_file_is_one_error_and_the_rest_run(adapter):
    ready(adapter)
    with pytest.warns(UserWarning):
        tasks = load(BAD)
    found = run_sync(tasks, harbor.make_policy("oracle"), adapter)
    assert found["fine"].reward == 1.0
    assert found["bad-reward"].reward == 0.0 and found["bad-reward"].end_reason == "submitted"
    assert found["bad-reward"].info["error"] == "reward.json holds a non-numeric or non-finite reward 'full marks'"
