"""Ending the agent's processes before a shared verifier runs (Harbor's rule: nothing the agent
left may touch the verdict), without ending the sandbox: the processes the sandbox had after
setup stay, and so do the children its TTL timer starts later (its next sleep, which a timer
that waits by the clock starts again when one is cut short), on local and docker. An agent's
process made a daemon (an orphan, adopted by PID 1) and one left in the background both go."""

from __future__ import annotations

import anyio
import pytest

import orchard_async as oa
from orchard_async.protocols import TIMER_NAME
from orchard_async.recipes.harbor.task import KILL_OTHERS, LIST_PROCESSES
from tests.conftest import backend_missing, docker_unready

IMAGE = "orchard/busybox:test"  # `orchard-async images build orchard/busybox:test`

# Each process as "pid ppid argv".
PROCESSES = r"""for d in /proc/[0-9]*; do
  a=$(tr '\0\n' '  ' <"$d/cmdline" 2>/dev/null) && pp=$(sed -n 's/^PPid:[[:space:]]*//p' "$d/status" 2>/dev/null) && echo "${d#/proc/} $pp $a"
done; :"""
AGENT_LEFT = (
    "setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & sleep 1000 </dev/null >/dev/null 2>&1 &"
)


def processes(text: str) -> dict[int, tuple[int, str]]:
    table = {}
    for line in text.splitlines():
        pid, ppid, *argv = line.split(" ", 2)
        table[int(pid)] = (int(ppid), argv[0] if argv else "")
    return table


def timer_sleeps(table: dict[int, tuple[int, str]]) -> list[int]:
    timers = {pid for pid, (_, argv) in table.items() if pid != 1 and TIMER_NAME in argv.split()}
    return [pid for pid, (ppid, argv) in table.items() if ppid in timers and argv.startswith("sleep ")]


@pytest.mark.parametrize("adapter", ["local", "docker"])
async def test_ending_the_agents_processes_spares_the_timer_and_what_it_starts_later(adapter: str) -> None:
    options: dict[str, object] = {}
    if adapter == "docker":
        if reason := await docker_unready(IMAGE):
            backend_missing(reason)
        options = {"image": IMAGE}
    async with oa.get_adapter(adapter, **options) as backend:
        box = await backend.create(oa.SandboxSpec(ttl=120))
        try:
            await anyio.sleep(0.5)  # the timer's first sleep has started
            baseline = (await box.exec(LIST_PROCESSES, timeout=30)).text
            assert any(token.startswith("timer=") for token in baseline.split()), baseline
            assert (await box.exec(AGENT_LEFT, timeout=10)).exit_code == 0
            # the timer's sleep cut short: its next one is not in the baseline, as a timer's
            # sleep started after setup would not be (docker's after its attach grace)
            before = processes((await box.exec(PROCESSES, timeout=30)).text)
            cut = timer_sleeps(before)
            assert cut, before
            await box.exec(" ".join(f"kill -KILL {pid};" for pid in cut), timeout=10)
            await anyio.sleep(1.5)
            table = processes((await box.exec(PROCESSES, timeout=30)).text)
            later = [pid for pid in timer_sleeps(table) if pid not in cut]
            assert later, table

            ended = await box.exec(KILL_OTHERS.replace("$KEEP", " ".join(baseline.split())), timeout=60)
            assert ended.exit_code == 0, ended.error_text

            after = processes((await box.exec(PROCESSES, timeout=30)).text)
            assert set(later) <= set(after), "the timer's later sleep was killed"
            left = [argv for _, argv in after.values() if argv.startswith(("sh -c while :", "sleep 1000"))]
            assert not left, left
            assert (await box.exec("echo alive", timeout=10)).text == "alive\n"
        finally:
            await box.close()
