"""Spec validation: a bad spec is a clear ConfigError at construction, never a half-made sandbox."""

from __future__ import annotations

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
    ],
)
def test_invalid_specs_name_what_is_wrong(fields: dict, message: str) -> None:
    with pytest.raises(oa.ConfigError, match=message):
        oa.SandboxSpec(**fields)


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
    cpu=st.none() | st.floats(allow_nan=False),
    pids=st.none() | st.integers(-10, 10**6),
    ttl=st.floats(allow_nan=False, allow_infinity=False),
    memory=st.none() | st.integers(-10, 2**40) | st.from_regex(r"\A-?[0-9]{1,6}(Ki|Mi|Gi|k|m|g|x)?\Z"),
)
def test_validation_accepts_exactly_the_valid_specs(cpu, pids, ttl, memory) -> None:
    def bad_memory() -> bool:
        if memory is None:
            return False
        if isinstance(memory, int):
            return memory <= 0
        return memory.startswith("-") or memory.endswith("x") or int(memory.rstrip("KMGikmg")) <= 0

    valid = (cpu is None or cpu > 0) and (pids is None or pids >= 1) and ttl > 0 and not bad_memory()
    try:
        oa.SandboxSpec(cpu=cpu, pids=pids, ttl=ttl, memory=memory)
    except oa.ConfigError:
        assert not valid
    else:
        assert valid
