"""Harbor's ``allowlist`` network mode against a server on this machine: the agent phase
reaches the allowlisted address and nothing else; setup and verification are offline."""

from __future__ import annotations

import shutil
from urllib.parse import urlsplit

import pytest

from orchard_async import ConfigError
from orchard_async.recipes import harbor
from orchard_async.recipes.harbor import config as cfg
from orchard_async.recipes.harbor.task import phase_networks
from tests.harbor.support import NETWORK, TASKS, fixture_server, load, ready, run_sync


def test_harbor_modes_become_the_engines_phase_networks():
    public, offline = cfg.Network("public"), cfg.Network("no-network")
    assert phase_networks(public, public, public) is None  # online throughout: nothing to switch
    assert phase_networks(offline, offline, offline) is None  # offline throughout, likewise
    phases = phase_networks(offline, cfg.Network("allowlist", ("192.0.2.7", "198.51.100.0/24")), offline)
    assert (phases.setup.mode, phases.scoring.mode, phases.setup.allow, phases.scoring.allow) == (
        "restricted", "restricted", (), ()
    )  # fmt: skip
    assert [(r.cidr, r.port_start, r.port_end) for r in phases.agent.allow] == [
        ("192.0.2.7/32", 1, 65535), ("198.51.100.0/24", 1, 65535)
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="wildcard"):
        phase_networks(offline, cfg.Network("allowlist", ("*.example.com",)), offline)


@pytest.mark.soak
@pytest.mark.parametrize("adapter", ["local", "docker", "kubernetes"])
def test_allowlist_reaches_the_allowed_server_only(adapter, tmp_path):
    ready(adapter)
    with fixture_server() as url:
        address = urlsplit(url).hostname
        for name, allowed in (("allowed", address), ("elsewhere", "192.0.2.1")):
            folder = tmp_path / name
            shutil.copytree(NETWORK / "allowlist", folder)
            toml = folder / "task.toml"
            toml.write_text(toml.read_text().replace("fixture-server", allowed))
        tasks = load(tmp_path)
        oracle = run_sync(tasks, harbor.make_policy("oracle"), adapter)
        empty = run_sync(load(tmp_path, ids=["allowed"]), harbor.make_policy("empty"), adapter)
    for trajectory in oracle.values():  # a step ran (else why the episode ended)
        assert trajectory.steps, (trajectory.task_id, trajectory.end_reason, trajectory.error)
    assert oracle["allowed"].reward == 1.0, oracle["allowed"].steps[0].observation[-500:]
    assert oracle["elsewhere"].reward == 0.0 and "urlopen" in oracle["elsewhere"].steps[0].observation
    assert empty["allowed"].reward == 0.0


@pytest.mark.soak
@pytest.mark.parametrize("adapter", ["local", "docker", "kubernetes"])
def test_the_no_network_fixture_reaches_the_server_when_online(adapter, tmp_path):
    """The control of the no-network fixture (tests/harbor/tasks/no-network): the same task
    with its agent allowed to reach the server its test runs against reaches it, so its oracle
    scores 0 there; offline, 1 (test_harbor_runs, test_harbor_provider). An allowlist, not
    public: in CI the server runs in the cluster's network namespace, which only the
    allowlist's link from the controller's side reaches on docker."""
    ready(adapter)
    with fixture_server() as url:
        online = tmp_path / "no-network-online"
        shutil.copytree(TASKS / "no-network", online)
        toml = online / "task.toml"
        allow = f'[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["{urlsplit(url).hostname}"]\n'
        toml.write_text(toml.read_text().replace("[agent]\n", allow))
        trajectory = run_sync(load(tmp_path), harbor.make_policy("oracle"), adapter)["no-network-online"]
    assert trajectory.steps, (trajectory.end_reason, trajectory.error)
    assert "allowlisted-payload" in trajectory.steps[0].observation, trajectory.steps[0].observation[-500:]
    assert trajectory.reward == 0.0 and trajectory.end_reason == "submitted", trajectory.error
