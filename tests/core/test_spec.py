"""Spec validation: a bad spec is a clear ConfigError at construction, never a half-made sandbox."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import orchard_async as oa


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cpu": 0}, "cpu"),
        ({"memory": "lots"}, "memory"),
        ({"memory": -5}, "memory"),
        ({"pids": 0}, "pids"),
        ({"ttl": -1}, "ttl"),
        ({"env": {"1BAD": "x"}}, "environment variable"),
        ({"workdir": "relative/path"}, "absolute"),
        ({"labels": {"bad key!": "x"}}, "label"),
        # wrong types: msgspec checks types only when it decodes, so construction must
        ({"ttl": math.inf}, "ttl must be a finite"),
        ({"ttl": math.nan}, "ttl"),
        ({"ttl": True}, "ttl"),
        ({"ttl": "60"}, "ttl"),
        ({"cpu": math.inf}, "cpu"),
        ({"cpu": math.nan}, "cpu"),
        ({"cpu": "2"}, "cpu"),
        ({"cpu": True}, "cpu"),
        ({"memory": True}, "memory"),
        ({"memory": 2.5}, "memory"),
        ({"memory": math.inf}, "memory"),
        ({"pids": True}, "pids"),
        ({"pids": 2.5}, "pids"),
        ({"pids": "16"}, "pids"),
        ({"env": {"A": 1}}, "environment variable A must be a string"),
        ({"env": {1: "x"}}, "environment variable name"),
        ({"env": ["A=1"]}, "env must be a mapping"),
        ({"env": {"A": "x\0y"}}, "NUL"),
        ({"labels": {"k": 1}}, "keys and values must be strings"),
        ({"labels": {2: "v"}}, "keys and values must be strings"),
        ({"labels": "k=v"}, "labels must be a mapping"),
        ({"network": "off"}, "network must be one of"),
        ({"network": None}, "network must be one of"),
        ({"pull": "sometimes"}, "pull must be one of"),
        ({"image": ""}, "image"),
        ({"image": 5}, "image"),
        ({"workdir": 5}, "absolute"),
        ({"workdir": "/a\0b"}, "NUL"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"writable_dirs": ("app",)}, "absolute"),
        ({"writable_dirs": "/app"}, "list of absolute paths"),
        ({"writable_dirs": ("/app/../etc",)}, "normalised"),
        ({"writable_dirs": ("/",)}, "normalised"),
        ({"writable_dirs": ("/a\0b",)}, "absolute"),
    ],
)
def test_invalid_specs_name_what_is_wrong(fields: dict, message: str) -> None:
    with pytest.raises(oa.ConfigError, match=message) as caught:
        oa.SandboxSpec(**fields)
    assert "\n" not in str(caught.value), "a spec error is one line"


def test_valid_specs_of_every_field_are_accepted() -> None:
    spec = oa.SandboxSpec(
        image="orchard/python:test",
        cpu=2,
        memory="512Mi",
        pids=64,
        network="on",
        env={"A": "1"},
        workdir="/work",
        ttl=60,
        labels={"team": "rl"},
        pull="never",
        writable_dirs=("/app", "/logs"),
        gpus=2,
    )
    assert (spec.cpu, spec.memory_bytes, spec.pids, spec.ttl) == (2, 512 * 2**20, 64, 60)
    assert (spec.writable_dirs, spec.gpus) == (("/app", "/logs"), 2)
    assert oa.SandboxSpec.parse({"writable_dirs": ["/app"], "gpus": 1}).writable_dirs == ("/app",)
    assert oa.SandboxSpec(cpu=0.5, memory=1 << 20, ttl=0.5).memory_bytes == 1 << 20


def test_parse_turns_type_errors_into_config_errors() -> None:
    with pytest.raises(oa.ConfigError, match="invalid sandbox spec"):
        oa.SandboxSpec.parse(b'{"network": "sometimes"}')
    assert oa.SandboxSpec.parse({"memory": "512Mi"}).memory_bytes == 512 * 2**20


async def test_an_invalid_spec_creates_nothing(tmp_path) -> None:
    adapter = oa.get_adapter("local", root=tmp_path)
    with pytest.raises(oa.ConfigError):
        await adapter.create(oa.SandboxSpec(pids=-1))
    assert not list(tmp_path.iterdir()) and await adapter.list_owned() == []


@given(
    cpu=st.none() | st.floats() | st.integers(-5, 64) | st.booleans(),
    pids=st.none() | st.integers(-10, 10**6) | st.floats(0, 100) | st.booleans(),
    ttl=st.floats() | st.integers(-5, 10**6),
    memory=st.none() | st.integers(-10, 2**40) | st.from_regex(r"\A-?[0-9]{1,6}(Ki|Mi|Gi|k|m|g|x)?\Z"),
)
def test_validation_accepts_exactly_the_valid_specs(cpu, pids, ttl, memory) -> None:
    def bad_memory() -> bool:
        if memory is None:
            return False
        if isinstance(memory, int):
            return memory <= 0
        return memory.startswith("-") or memory.endswith("x") or int(memory.rstrip("KMGikmg")) <= 0

    def number(value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    valid = (
        (cpu is None or (number(cpu) and math.isfinite(cpu) and cpu > 0))
        and (pids is None or (isinstance(pids, int) and not isinstance(pids, bool) and pids >= 1))
        and number(ttl)
        and math.isfinite(ttl)
        and ttl > 0
        and not bad_memory()
    )
    try:
        oa.SandboxSpec(cpu=cpu, pids=pids, ttl=ttl, memory=memory)
    except oa.ConfigError:
        assert not valid
    else:
        assert valid
