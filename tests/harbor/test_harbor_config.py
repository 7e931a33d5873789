"""Harbor's task.toml, instruction and reward rules as the recipe reads them (no sandbox)."""

from __future__ import annotations

import io
import tarfile

import pytest

from orchard_async import ConfigError
from orchard_async.recipes.harbor import config as cfg
from orchard_async.recipes.harbor.cli import validate
from orchard_async.recipes.harbor.task import HarborOptions, SeparateHarborTask, artifact_files
from tests.harbor.support import BAD, OPTIONS, TASKS, load


def test_legacy_and_current_configs_give_the_same_resources():
    legacy = cfg.parse_config('version = "1.0"\n[environment]\nmemory = "2G"\nstorage = "4G"\ncpus = 1\n')
    current = cfg.parse_config('schema_version = "1.4"\n[environment]\nmemory_mb = 2048\nstorage_mb = 4096\ncpus = 1\n')
    assert legacy.schema_version == "1.0"
    assert (legacy.environment.memory_mb, legacy.environment.storage_mb) == (2048, 4096)
    assert legacy.environment == current.environment
    with pytest.raises(ConfigError, match="conflicts"):
        cfg.parse_config('[environment]\nmemory = "2G"\nmemory_mb = 1024\n')


def test_network_per_phase_and_legacy_allow_internet():
    config = cfg.parse_config(
        '[environment]\nnetwork_mode = "no-network"\n[agent]\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["Example.COM.", "10.0.0.0/8"]\n[verifier]\nenvironment_mode = "separate"\n'
    )
    assert config.agent_network() == cfg.Network("allowlist", ("example.com", "10.0.0.0/8"))
    assert config.verifier_network().mode == "no-network"  # the separate verifier's copy of [environment]
    assert cfg.parse_config("[environment]\nallow_internet = false\n").environment.network.mode == "no-network"
    for bad, message in [
        ('[environment]\nnetwork_mode = "bridge"\n', "unknown network mode"),
        ('[environment]\nallowed_hosts = ["a.com"]\n', "only valid"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["http://a.com/x"]\n', "not a host name"),
        ('[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n', "incompatible"),
    ]:
        with pytest.raises(ConfigError, match=message):
            cfg.parse_config(bad)


def test_rewards_as_harbor_reads_them():
    assert cfg.parse_rewards(b'{"reward": 1, "style": 0.5}', b"0") == {"reward": 1.0, "style": 0.5}  # json wins
    assert cfg.parse_rewards(None, b" 0.25\n") == {"reward": 0.25}
    assert cfg.headline({"a": 1.0, "b": 0.0}) == 0.5 and cfg.headline({"reward": 0.0, "a": 1.0}) == 0.0
    for reward_json, reward_txt, message in [
        (b'{"reward": "1"}', None, "non-numeric"),
        (b'{"reward": NaN}', None, "non-finite"),
        (b"1", None, "flat object"),
        (b"", b"1", "empty"),
        (None, b"yes", "not a number"),
    ]:
        with pytest.raises(ValueError, match=message):
            cfg.parse_rewards(reward_json, reward_txt)
    with pytest.raises(FileNotFoundError):
        cfg.parse_rewards(None, None)


def test_env_templates_and_canary():
    assert cfg.resolve_env({"A": "${X:-d}", "B": "${Y}"}, {"Y": "y"}) == {"A": "d", "B": "y"}
    with pytest.raises(ConfigError, match=r"\$Z"):
        cfg.resolve_env({"A": "${Z}"}, {})
    assert cfg.strip_canary("<!-- canary GUID 1 -->\nDo it.\n") == "Do it.\n"


def test_fixture_set_loads_with_its_settings():
    tasks = {task.id: task for task in load()}
    assert len(tasks) == 10
    assert "canary" not in tasks["hello-legacy"].instruction.lower()
    assert tasks["hello-legacy"].spec.memory == "2048Mi" and tasks["hello-legacy"].spec.image.startswith(
        "orchard-harbor/"
    )
    assert tasks["docker-image"].spec.image == "orchard/python:test" and tasks["docker-image"].spec.workdir == "/app"
    assert tasks["no-network"].spec.network == "none" and tasks["reward-json"].spec.network == "on"
    assert tasks["agent-user"].agent_user == "agent" and tasks["workdir"].workdir == "/srv/work"
    assert tasks["env-health"].spec.env == {"TASK_MODE": "strict"}
    separate = tasks["separate-verifier"]
    assert isinstance(separate, SeparateHarborTask) and separate.scorer_spec is not None
    assert [step.name for step in tasks["multi-step"].config.steps] == ["create", "extend"]
    multi = tasks["multi-step"]  # the first step's instruction is the episode's; each step gets its own
    assert multi.instruction == multi.step_instruction(0) and "Create `/app/list.txt`" in multi.instruction
    assert "Append" in multi.step_instruction(1) and "Append" not in multi.instruction
    assert (multi.step_turns, multi.max_steps, multi.step_timeout(1)) == (50, 100, 240.0)


def test_bad_folders_are_one_line_each_and_the_rest_load():
    verdicts = {v.name: v for v in validate(BAD, HarborOptions.resolve(OPTIONS), "local")}
    assert not verdicts["malformed-toml"].loads and "not valid TOML" in verdicts["malformed-toml"].why
    assert verdicts["missing-tests"].why == "no tests/test.sh"
    assert "unknown network mode 'bridge'" in verdicts["unknown-network"].why
    assert verdicts["fine"].runs and verdicts["bad-reward"].runs  # a bad reward.json shows only when it runs
    assert all("\n" not in v.line() for v in verdicts.values())
    with pytest.warns(UserWarning, match="missing-tests: no tests/test.sh"):
        assert {t.id for t in load(BAD)} == {"bad-reward", "fine"}


def test_artifacts_cross_only_as_files_below_their_paths():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, kind in [("app/report.json", tarfile.REGTYPE), ("usr/local/bin/python3", tarfile.REGTYPE),
                           ("logs/artifacts/link", tarfile.SYMTYPE), ("app/../etc/passwd", tarfile.REGTYPE)]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mode = kind, 0 if kind != tarfile.REGTYPE else 2, 0o4755
            tar.addfile(info, io.BytesIO(b"{}") if kind == tarfile.REGTYPE else None)
    files, refused = artifact_files(buffer.getvalue(), ["/app/report.json", "/logs/artifacts"])
    assert [(path, mode) for path, _, mode in files] == [("/app/report.json", 0o755)]
    assert refused == ["usr/local/bin/python3", "logs/artifacts/link", "app/../etc/passwd"]


def test_validate_names_what_is_missing_on_docker(monkeypatch):
    from orchard_async.recipes.harbor import cli

    monkeypatch.setattr(cli.images, "docker_available", lambda: True)
    monkeypatch.setattr(cli.images, "image_present", lambda tag: not tag.startswith("orchard-harbor/"))
    verdicts = {v.name: v for v in validate(TASKS, HarborOptions.resolve(OPTIONS), "docker")}
    assert "orchard-async harbor build" in verdicts["hello-legacy"].why
    assert "cannot switch users" in verdicts["agent-user"].why
    assert verdicts["docker-image"].runs
    unmapped = {v.name: v for v in validate(TASKS, HarborOptions.resolve({}), "docker")}
    monkeypatch.setattr(cli.images, "image_present", lambda tag: False)
    assert "image_map" in {v.name: v for v in validate(TASKS, HarborOptions.resolve({}), "docker")}["docker-image"].why
    assert unmapped["docker-image"].loads
