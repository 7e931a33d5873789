"""Orchard commands in a sandbox's bash lane (serve/lane.py) mean what a new `bash -c` means:
no state carried from one command to the next, nothing of the lane's own visible, the same
answers as the plain way (a new bash process per command) for the same probes.

Local adapter only: the lane needs output FIFOs the service shares with the sandbox."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from orchard_async.apps.serve.app import JOBS, REGISTRY
from orchard_async.apps.serve.lane import LaneClient

from .conftest import make_sandbox


def exec_body(command: str, **fields: Any) -> dict[str, Any]:
    body = {"command": command, "timeout_seconds": None, "cwd": None, "env": None, "login_shell": False, "wait": True}
    return body | fields


@pytest.fixture
async def lane_client(start_service):
    service = await start_service("local")
    async with service.client() as http:
        http.app = service.app  # type: ignore[attr-defined]
        yield http


async def run(http: httpx.AsyncClient, sandbox_id: str, command: str, **fields: Any) -> dict[str, Any]:
    answer = await http.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(command, **fields))
    assert answer.status_code == 200, answer.text
    return answer.json()


def lane_of(http: httpx.AsyncClient, sandbox_id: str) -> Any:
    (box,) = [box for box in http.app[REGISTRY].boxes.values() if box.id == sandbox_id]  # type: ignore[attr-defined]
    return box.lane


async def lane_started(http: httpx.AsyncClient, sandbox_id: str) -> LaneClient:
    """The sandbox's lane, once its start in the background (lane.py) has ended; commands in
    the meantime take the plain way."""
    for _ in range(600):
        lane = lane_of(http, sandbox_id)
        if isinstance(lane, asyncio.Task):
            await asyncio.wait([lane])
        await run(http, sandbox_id, "true")  # the next command takes the lane once it is up
        lane = lane_of(http, sandbox_id)
        if isinstance(lane, LaneClient) and not lane.lost:
            return lane
        assert lane is not False, "no bash lane could be started"
    raise AssertionError("the bash lane did not start")


async def bash_sandbox(http: httpx.AsyncClient) -> str:
    sandbox_id = await make_sandbox(http)
    if (await run(http, sandbox_id, "command -v bash"))["exit_code"] != 0:
        pytest.skip("no bash on this machine")
    await lane_started(http, sandbox_id)
    return sandbox_id


async def test_a_command_sees_nothing_an_earlier_one_set(lane_client: httpx.AsyncClient) -> None:
    sandbox_id = await bash_sandbox(lane_client)
    first = await run(
        lane_client,
        sandbox_id,
        "x=1; export Y=2; f() { :; }; cd /; set -e; set -o pipefail; shopt -s extglob expand_aliases;"
        " alias ll=ls; trap 'echo bye' EXIT; umask 077; readonly R=1; declare -A M=([k]=v)",
    )
    assert first["exit_code"] == 0 and first["stdout"] == "bye\n", first
    second = await run(
        lane_client,
        sandbox_id,
        'echo "x=${x-unset} Y=${Y-unset} R=${R-unset} M=${M[k]-unset}"; declare -F f || echo no-f; pwd; '
        "echo \"$-\"; shopt extglob expand_aliases; set -o | grep -E '^(errexit|pipefail)'; "
        "alias ll 2>&1 || echo no-alias; trap -p EXIT; umask",
    )
    assert second["exit_code"] == 0, second
    workdir = (await run(lane_client, sandbox_id, "cd /workspace 2>/dev/null; pwd"))["stdout"]
    lines = second["stdout"].splitlines()
    assert lines[0] == "x=unset Y=unset R=unset M=unset"
    assert lines[1] == "no-f"
    assert lines[2] + "\n" == workdir
    assert "e" not in lines[3]
    assert [line.split() for line in lines[4:8]] == [
        ["extglob", "off"],
        ["expand_aliases", "off"],
        ["errexit", "off"],
        ["pipefail", "off"],
    ]
    assert lines[8:10] == ["bash: line 1: alias: ll: not found", "no-alias"]
    assert len(lines) == 11 and lines[10] != "0077"  # no EXIT trap; not the first command's umask


async def test_nothing_of_the_lane_is_visible(lane_client: httpx.AsyncClient) -> None:
    sandbox_id = await bash_sandbox(lane_client)
    job = await run(
        lane_client,
        sandbox_id,
        'compgen -A function; compgen -v _o_; trap -p EXIT TERM HUP USR1; echo "fn=${FUNCNAME[*]} src=${BASH_SOURCE[*]}"; '
        'echo "$0 $BASH_SUBSHELL $LINENO $#"; [ "$BASH" = "$(command -v bash)" ] && echo bash-is-bash; '
        'echo "$BASH_EXECUTION_STRING" | head -c 12',
    )
    assert job["exit_code"] == 0, job
    assert job["stdout"].splitlines() == ["fn= src=", "bash 0 1 0", "bash-is-bash", "compgen -A f"], job


# Probes whose whole answer (exit code, stdout, stderr) must be the same in the lane and as a
# new `bash -c`: error messages and line numbers, `return`/`local` outside a function, exits,
# stdin, env and cwd handling, bash syntax.
PROBES = [
    "no_such_command_here",
    "true\nno_such_command_on_line_2",
    "return 3; echo after-return $?",
    "local v=1; echo after-local $?",
    "exit 7",
    "echo out; echo err >&2; exit 3",
    "cat; read line; echo read=$?",
    "[[ a == a ]] && arr=(1 2 3) && echo \"${#arr[@]} $'x\\ty' {a,b}\"",
    'echo "$A|$PWD"',
    "echo $LINENO; echo $LINENO",
    "kill -s USR2 $BASHPID",
    "trap -p; ulimit -n; umask; jobs",
    "seq 1 100000; seq 1 50000 >&2",
]


async def test_the_same_answers_as_a_new_bash(lane_client: httpx.AsyncClient) -> None:
    sandbox_id = await bash_sandbox(lane_client)
    jobs = lane_client.app[JOBS]  # type: ignore[attr-defined]
    for probe in PROBES:
        for cwd in (None, "/no/such/dir"):
            answers = []
            for lanes in (True, False):
                jobs.bash_lanes = lanes
                job = await run(lane_client, sandbox_id, probe, cwd=cwd, env={"A": "a b"})
                answers.append({key: job[key] for key in ("status", "exit_code", "stdout", "stderr")})
            jobs.bash_lanes = True
            assert answers[0] == answers[1], (probe, cwd)


async def test_a_timeout_kills_every_process_of_the_command(lane_client: httpx.AsyncClient) -> None:
    sandbox_id = await bash_sandbox(lane_client)
    mark = uuid.uuid4().hex[:8]
    job = await run(
        lane_client,
        sandbox_id,
        f"(sleep 300; echo late) & echo $! >/tmp/{mark}; sh -c 'sleep 301' & wait",
        timeout_seconds=1,
    )
    assert job["exit_code"] == 124 and job["status"] == "failed", job
    after = await run(lane_client, sandbox_id, f"kill -0 $(cat /tmp/{mark}) 2>/dev/null && echo alive || echo gone")
    assert after["stdout"] == "gone\n", after
    assert (await run(lane_client, sandbox_id, "echo still-usable"))["stdout"] == "still-usable\n"


async def test_a_command_that_kills_the_lane_gets_a_new_one_next(lane_client: httpx.AsyncClient) -> None:
    sandbox_id = await bash_sandbox(lane_client)
    before = lane_of(lane_client, sandbox_id)
    term = await run(lane_client, sandbox_id, "kill $$; echo lane-ignores-term")  # `bash -c` would die: 143
    assert term["stdout"] == "lane-ignores-term\n" and lane_of(lane_client, sandbox_id) is before, term
    killed = await run(lane_client, sandbox_id, "kill -9 $$")  # $$ is the lane (see lane.py)
    assert killed["status"] == "failed", killed
    after = await run(lane_client, sandbox_id, "echo $BASH_SUBSHELL")
    assert after["exit_code"] == 0 and after["stdout"] == "0\n", after
    assert await lane_started(lane_client, sandbox_id) is not before


async def test_login_shell_and_startup_variables_take_the_plain_way(lane_client: httpx.AsyncClient) -> None:
    sandbox_id = await bash_sandbox(lane_client)
    pid_of_lane = '[ "$$" = "$BASHPID" ] && echo own-process || echo forked'
    assert (await run(lane_client, sandbox_id, pid_of_lane))["stdout"] == "forked\n"
    login = await run(lane_client, sandbox_id, pid_of_lane, login_shell=True)
    assert login["stdout"].splitlines()[-1] == "own-process", login
    startup = await run(lane_client, sandbox_id, pid_of_lane, env={"BASH_ENV": "/dev/null"})
    assert startup["stdout"] == "own-process\n", startup


async def test_a_command_in_the_lane_has_no_signal_ignored(lane_client: httpx.AsyncClient) -> None:
    """The lane starts through `env --default-signal` (it is a background job of the sandbox's
    shell, SIGINT and SIGQUIT ignored, which no bash can reset), and each command's subshell
    resets what the lane itself catches: a command sees what a fresh `bash -c` would."""
    sandbox_id = await make_sandbox(lane_client)
    await lane_started(lane_client, sandbox_id)
    probe = await run(lane_client, sandbox_id, "trap -p; grep -E '^SigIgn' /proc/self/status")
    assert probe["stdout"] == "SigIgn:\t0000000000000000\n", probe
    assert isinstance(lane_of(lane_client, sandbox_id), LaneClient)  # it ran in the lane
