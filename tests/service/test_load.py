"""Load through the service with a ``kill -9`` in the middle (``python -m orchard_async.bench.service_load``):
every command's output checked, nothing leaked, every error the client saw one it can retry.
The default run's is small (seconds, local); the soak run's is the issue's 200 × 10 at 32, on
local and docker, with and without the kill."""

from __future__ import annotations

import pytest

import orchard_async as oa
from orchard_async.bench import service_load as load
from tests.conftest import require_docker


def check(result: dict, *, killed: bool) -> None:
    assert result["commands_wrong"] == 0, result["wrong_examples"]
    assert result["episodes_failed"] == 0 and result["episodes_done"] == result["sandboxes"], result
    assert result["commands_right"] >= result["sandboxes"] * result["commands_each"], result
    assert result["client_errors_not_retryable"] == {}, result["client_errors"]
    running = result["leaks_service_running"]
    if killed and result["adapter"] != "local":
        # A create the kill cut off after its container started is re-adopted by the restarted
        # service, while its client, never answered, made another: that sandbox is the service's,
        # listed (ended by its TTL or the service's stop), never a container it does not know of.
        assert running.get("containers", 0) == running.get("service_lists", 0), result
    else:
        assert running == {key: 0 for key in running}, result
    assert result["leaks_after_stop"] == {key: 0 for key in result["leaks_after_stop"]}, result
    assert result["service_exit_code"] == 0
    if not killed:
        assert result["client_errors"] == {} and not result["killed"], result
        return
    assert result["killed"], result
    answers = result["answers_after_restart"]
    assert sum(answers.values()) == result["live_at_kill"], result
    if result["adapter"] == "local":
        # its sandboxes die with the service: every id held at the kill answers 404, none a sandbox
        assert set(answers) <= {"404 sandbox_lost", "404 unknown_sandbox"}, answers
        assert result["readopted_at_restart"] == 0
    else:
        # re-adopted (or deleted by its own client's retry by the time it was asked: 404)
        assert set(answers) <= {"200 ready", "404 unknown_sandbox"}, answers
        assert result["readopted_at_restart"] >= answers.get("200 ready", 0), result
        # What the restarted service found of its own (its log's count, not the backend's: a count
        # of containers races the clients creating again): each re-adopted, lost when it could
        # not be attached, or removed when no key reaches it. That it found every container is
        # the leak check's above: while it runs, it lists each one there is.
        accounted = result["readopted_at_restart"] + result["lost_at_restart"] + result["removed_at_restart"]
        assert accounted == result["found_at_restart"] > 0, result


def needs_docker() -> None:
    require_docker(load.IMAGE)


def run(*argv: str) -> dict:
    return oa.run(load.run_load, load.parse(list(argv)))


def test_a_small_load_with_a_kill_on_local() -> None:
    result = run("--adapter", "local", "--sandboxes", "12", "--commands", "4", "--concurrency", "6", "--kill-at", "0.4")
    check(result, killed=True)


@pytest.mark.soak
@pytest.mark.parametrize("adapter", ["local", "docker"])
@pytest.mark.parametrize("kill", [False, True], ids=["steady", "kill-9"])
def test_200_sandboxes_10_commands_at_32(adapter: str, kill: bool) -> None:
    if adapter == "docker":
        needs_docker()
    result = run("--adapter", adapter, *(["--kill-at", "0.4"] if kill else []))
    check(result, killed=kill)
