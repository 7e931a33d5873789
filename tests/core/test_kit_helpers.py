"""The kit's shared helpers, each checked against what it stands for: ``procfs`` against
processes this test starts, ``retry`` against a clock it sets, ``labels`` against the rules
Kubernetes puts on a label value."""

from __future__ import annotations

import email.utils
import os
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_async.kit import labels, procfs
from orchard_async.kit.retry import Attempts, Backoff, retry_after

GONE = 2**22 + 12345  # above any pid_max: no such process
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")  # Kubernetes' rule


@pytest.fixture
def child():
    """A python child that waits, with a variable of its own in its environment."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={**os.environ, "PROCFS_TEST_MARKER": "marker-42"},
    )
    yield process
    process.stdin.close()
    process.wait()


# -- procfs ------------------------------------------------------------------------------------


def test_procfs_reads_a_child_process(child: subprocess.Popen) -> None:
    assert child.pid in procfs.pids()
    assert procfs.parent(child.pid) == os.getpid()
    assert child.pid in procfs.children(os.getpid())
    assert procfs.comm(child.pid) == os.path.basename(sys.executable)[:15]
    assert procfs.cmdline(child.pid)[:2] == [sys.executable.encode(), b"-c"]
    assert procfs.ns_pids(child.pid)[0] == child.pid
    environs = dict(procfs.environs())
    assert b"PROCFS_TEST_MARKER=marker-42\0" in environs[child.pid]
    assert b"PROCFS_TEST_MARKER=" not in environs[os.getpid()]
    # a child starts after its parent: start times are ticks since boot
    assert int(procfs.start_ticks(child.pid)) >= int(procfs.start_ticks(os.getpid()))


def test_procfs_start_time_is_the_stat_field() -> None:
    with open(f"/proc/{os.getpid()}/stat") as fh:
        fields = fh.read().split(") ")[-1].split()
    assert procfs.start_ticks(os.getpid()) == procfs.start_ticks() == fields[19]
    assert procfs.stat()[0] in "RS"  # this process is running or sleeping


def test_procfs_cpu_and_memory_of_this_process() -> None:
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # spend some CPU to be counted
        pass
    own, children = procfs.cpu_seconds()
    assert own > 0 and children >= 0
    assert procfs.status_kib("VmHWM") >= procfs.status_kib("VmRSS") > 0
    assert procfs.memory_total_kib() > procfs.status_kib("VmRSS")
    assert procfs.machine_busy_seconds() > 0
    assert procfs.pid_namespace().startswith("pid:[")
    cgroups = procfs.own_cgroups()
    assert cgroups and all(line.count(":") >= 2 for line in cgroups)


def test_procfs_says_nothing_of_a_process_that_is_gone() -> None:
    assert procfs.stat(GONE) is None and procfs.start_ticks(GONE) is None and procfs.cpu_seconds(GONE) is None
    assert procfs.comm(GONE) is None and procfs.cmdline(GONE) is None and procfs.status(GONE) is None
    assert procfs.parent(GONE) is None and procfs.status_kib("VmRSS", GONE) is None
    assert procfs.children(GONE) == [] and procfs.ns_pids(GONE) == []


# -- retry -------------------------------------------------------------------------------------


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("3") == 3.0 and retry_after("0.5") == 0.5
    assert retry_after("-2") == 0.0  # never a negative pause
    assert retry_after(None) is None and retry_after("") is None and retry_after("soon") is None
    in_a_minute = retry_after(email.utils.formatdate(time.time() + 60, usegmt=True))
    assert in_a_minute is not None and 55 < in_a_minute <= 60
    assert retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0


def test_backoff_doubles_up_to_its_cap_with_jitter_as_a_factor() -> None:
    plain = Backoff(0.25, cap=2.0)
    assert [plain.delay(n) for n in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert Backoff(0.05, cap=30.0).delay(10_000) == 30.0  # no overflow after many failures
    assert Backoff(1.0).delay(3) == 8.0  # no cap
    jittered = Backoff(0.1, cap=5.0, jitter=(0.5, 1.5))
    draws = [jittered.delay(6) for _ in range(200)]  # capped at 5, then the factor
    assert all(2.5 <= d <= 7.5 for d in draws) and max(draws) > 5.0 and min(draws) < 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_attempts_end_when_their_count_is_spent() -> None:
    attempts = Attempts(Backoff(1.0, cap=3.0), most=4, clock=Clock())
    assert [attempts.next_pause() for _ in range(4)] == [1.0, 2.0, 3.0, None]
    assert attempts.failures == 4 and not attempts.out_of_time
    assert attempts.time_left() == float("inf")


def test_attempts_never_pause_past_their_deadline() -> None:
    clock = Clock()
    attempts = Attempts(Backoff(1.0), deadline=clock.now + 4.0, clock=clock)
    assert attempts.next_pause() == 1.0
    clock.now += 1.0
    assert attempts.next_pause(asked=3.0) == 3.0  # the server's pause, in place of the backoff's; it fits
    assert attempts.fits(3.0) and not attempts.fits(3.01)
    clock.now += 2.5
    assert attempts.time_left() == 0.5
    assert attempts.next_pause() is None and attempts.out_of_time  # the backoff's 4 s would end past it
    assert attempts.failures == 3


# -- labels ------------------------------------------------------------------------------------


@given(st.text(max_size=200))
def test_both_label_spellings_are_valid_label_values(text: str) -> None:
    value, episode = labels.label_value(text), labels.episode_label(text)
    assert len(value) <= 63 and LABEL_VALUE.fullmatch(value)
    assert len(episode) <= 63 and LABEL_VALUE.fullmatch(episode) and episode


def test_label_value_keeps_the_head_and_episode_label_the_tail() -> None:
    assert labels.label_value("-user@host.example-") == "user_host.example"
    assert labels.episode_label("-task/a#0:1-") == "task-a-0-1"
    long = "x" * 70 + "/attempt-3"
    assert labels.label_value(long) == "x" * 63
    assert labels.episode_label(long) == "x" * 53 + "-attempt-3"
    assert labels.label_value("///") == "" and labels.episode_label("///") == "episode"
