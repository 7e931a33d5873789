"""``doctor``'s warning for a Docker daemon with libnetwork's known deadlock (no daemon needed)."""

from __future__ import annotations

import pytest

from orchard_async.adapters.docker.doctor import known_deadlock


@pytest.mark.parametrize("version", ["20.10.24+dfsg1", "20.10.5", "19.03.15"])
def test_a_daemon_with_the_deadlock_is_named_with_what_to_do(version: str) -> None:
    warning = known_deadlock(version)
    assert "WARNING" in warning and "moby/moby#42545" in warning and "docker-up.sh" in warning


@pytest.mark.parametrize("version", ["20.10.27", "23.0.1", "24.0.7", "27.3.1"])
def test_a_daemon_with_the_fix_gets_no_warning(version: str) -> None:
    assert known_deadlock(version) == ""
