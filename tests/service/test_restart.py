"""A service killed with ``kill -9`` and started again against the same docker daemon takes
its sandboxes back: same ids, same files, same owners and quotas; one that died meanwhile
answers 404 saying it was lost in the restart. Real processes, a real daemon."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard_async.apps.serve.app import b64decode, b64encode
from tests.conftest import require_docker
from tests.service.conftest import KEY_A, KEY_B, write_keys

IMAGE = "orchard/busybox:test"
REGISTER = ("orchard_async.apps.serve.cli:add_serve_command", "run the environment service")
PROGRAM = (
    "import sys; from orchard_async.apps import cli; "
    f"cli.OUTSIDE_COMMANDS['serve'] = {REGISTER!r}; sys.exit(cli.main(sys.argv[1:]))"
)


@pytest.fixture(scope="module", autouse=True)
def docker_daemon() -> None:
    require_docker(IMAGE)


class Serve:
    """``orchard-async serve`` as a process, its log in a file (a pipe nobody reads would fill)."""

    def __init__(self, tmp_path: Path, name: str, *extra: str, adapter: str = "docker"):
        self.log = tmp_path / f"serve-{time.monotonic_ns()}.log"
        argv = ["serve", "--adapter", adapter, "--port", "0", "--name", name, *extra]
        with self.log.open("w") as log:
            self.process = subprocess.Popen([sys.executable, "-c", PROGRAM, *argv], stderr=log)
        deadline = time.monotonic() + 60
        while not (found := re.search(r"http://\S+", self.log.read_text())):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        self.url = found[0].rstrip(")")

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": key}, timeout=120)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


def containers(name: str) -> list[str]:
    """The containers (running or not) of the service called ``name``."""
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=orchard.serve.name={name}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def pause(container: str) -> None:
    """`docker pause`, retried: freezing a container whose old session is still being killed
    (the service just died) can fail for a moment on a loaded machine."""
    for _ in range(10):
        done = subprocess.run(["docker", "pause", container], capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"docker pause {container} failed: {done.stderr.strip()}")


def container_of(name: str, public_id: str) -> str:
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-q",
            "--filter",
            f"label=orchard.serve.name={name}",
            "--filter",
            f"label=orchard.serve.id={public_id}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    (container,) = listed.stdout.split()
    return container


def make(http: httpx.Client, image: str = IMAGE, **body: object) -> str:
    created = http.post("/sandboxes", json={"image": image, "block_network": True, "timeout": 600, **body})
    assert created.status_code == 200, created.text
    sandbox_id = created.json()["sandbox_id"]
    ready = http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 120})
    assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
    return sandbox_id


def exec_(http: httpx.Client, sandbox_id: str, command: str) -> httpx.Response:
    """An exec as Orchard's client and the remote adapter send it: a 503 is retried after
    its Retry-After (what a restarting service answers while it re-attaches a sandbox)."""
    for _ in range(120):
        answer = http.post(
            f"/sandboxes/{sandbox_id}/exec", json={"command": command, "wait": True, "timeout_seconds": 60}
        )
        if answer.status_code != 503:
            return answer
        time.sleep(float(answer.headers["Retry-After"]))
    raise AssertionError(f"still 503 after 120 tries: {answer.text}")


def run(http: httpx.Client, sandbox_id: str, command: str) -> dict:
    answer = exec_(http, sandbox_id, command)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture
def service_name(tmp_path: Path) -> Iterator[str]:
    name = f"test-restart-{uuid.uuid4().hex[:10]}"
    yield name
    # whatever a failed test left: only this test's containers, found by its service's name
    for container in containers(name):
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)


def test_a_killed_service_restarted_serves_the_same_sandboxes(tmp_path: Path, service_name: str) -> None:
    keys = str(write_keys(tmp_path / "keys.json", max_sandboxes=2))
    first = Serve(tmp_path, service_name, "--keys", keys)
    try:
        with first.client(KEY_A) as team_a, first.client(KEY_B) as team_b:
            body = {"sandbox_id": "box-1", "cpu": "1", "memory": "256Mi"}
            named = make(team_a, **body)
            unnamed = make(team_a)
            other = make(team_b)
            payload = bytes(range(256)) * 4
            uploaded = team_a.post(
                f"/sandboxes/{named}/files", json={"path": "/workspace/kept.bin", "content": b64encode(payload)}
            )
            assert uploaded.status_code == 200, uploaded.text
            assert run(team_b, other, "echo b-was-here > b.txt")["exit_code"] == 0
            described = team_a.get(f"/sandboxes/{named}").json()
            body_of_job = {"command": "sleep 300", "timeout_seconds": 400, "wait": False}
            running = team_a.post(f"/sandboxes/{unnamed}/exec", json=body_of_job).json()
            assert running["status"] in ("queued", "running"), running
    finally:
        first.kill()
    assert len(containers(service_name)) == 3  # the sandboxes outlived their service

    second = Serve(tmp_path, service_name, "--keys", keys)
    try:
        with second.client(KEY_A) as team_a, second.client(KEY_B) as team_b:
            ready = team_a.get(f"/sandboxes/{named}/wait", params={"timeout": 120})
            assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
            got = team_a.get(f"/sandboxes/{named}/files", params={"path": "/workspace/kept.bin"})
            assert got.status_code == 200, got.text
            assert b64decode(got.json()["content"], "content") == payload
            again = team_a.get(f"/sandboxes/{named}").json()
            for field in ("image", "cpu", "memory", "timeout", "created_at", "namespace", "block_network"):
                assert again[field] == described[field], field
            # a client's retry of its create gets the same sandbox, not a conflict
            retried = team_a.post("/sandboxes", json={"image": IMAGE, "block_network": True, "timeout": 600, **body})
            assert retried.status_code == 200 and retried.json()["sandbox_id"] == named, retried.text
            assert run(team_a, named, "cat kept.bin | wc -c")["stdout"].strip() == str(len(payload))
            # tenancy and quotas count what was re-adopted
            assert {box["sandbox_id"] for box in team_a.get("/sandboxes").json()["sandboxes"]} == {named, unnamed}
            assert team_b.get(f"/sandboxes/{named}").status_code == 404
            assert run(team_b, other, "cat b.txt")["stdout"] == "b-was-here\n"
            over = team_a.post("/sandboxes", json={"image": IMAGE, "block_network": True})
            assert over.status_code == 503 and over.json()["reason"] == "quota_sandboxes", over.text
            assert team_a.get(f"/sandboxes/{unnamed}/wait", params={"timeout": 120}).json()["ready"] is True
            # the job running at the kill: failed, saying why (its command died with the old session)
            for path in (f"/jobs/{running['job_id']}", f"/jobs/{running['job_id']}/wait"):
                lost_job = team_a.get(path)
                assert lost_job.status_code == 200, lost_job.text
                assert lost_job.json()["status"] == "failed" and "service restarted" in lost_job.json()["error"]
            assert "sleep 300" not in run(team_a, unnamed, "ps -o args")["stdout"]
            assert team_a.get("/jobs/not-a-job-id").status_code == 404
            assert team_a.delete(f"/sandboxes/{unnamed}").status_code == 200
    finally:
        second.stop()
    assert second.process.returncode == 0
    assert containers(service_name) == []  # a clean stop removes them all
    log = second.log.read_text()
    assert KEY_A not in log and KEY_B not in log


@pytest.mark.soak  # 20-40 s of a worker: the soak run keeps the default under 5 minutes
def test_a_sandbox_that_cannot_be_taken_back_is_removed_and_answers_404(tmp_path: Path, service_name: str) -> None:
    first = Serve(tmp_path, service_name)
    try:
        with first.client("") as http:
            survivor, victim, vanished = make(http), make(http), make(http)
            assert run(http, survivor, "echo alive > f")["exit_code"] == 0
    finally:
        first.kill()
    # a frozen container takes no exec: found, but it cannot be re-attached
    pause(container_of(service_name, victim))
    subprocess.run(["docker", "rm", "-f", container_of(service_name, vanished)], check=True, capture_output=True)
    second = Serve(tmp_path, service_name)
    try:
        with second.client("") as http:
            assert run(http, survivor, "cat f")["stdout"] == "alive\n"
            lost = exec_(http, victim, "true")
            assert lost.status_code == 404 and lost.json()["reason"] == "sandbox_lost", lost.text
            assert "lost when the service restarted" in lost.json()["detail"]
            assert http.get(f"/sandboxes/{victim}").status_code == 404
            gone = exec_(http, vanished, "true")
            assert gone.status_code == 404, gone.text
            assert [box["sandbox_id"] for box in http.get("/sandboxes").json()["sandboxes"]] == [survivor]
            assert len(containers(service_name)) == 1  # the one that could not be taken back was removed
    finally:
        second.stop()
    assert containers(service_name) == []


@pytest.mark.soak  # 20-40 s of a worker: the soak run keeps the default under 5 minutes
def test_a_sandbox_nobody_takes_back_ends_after_its_grace(tmp_path: Path, service_name: str) -> None:
    first = Serve(tmp_path, service_name, "--reattach-grace", "2")
    try:
        with first.client("") as http:
            sandbox_id = make(http)
    finally:
        first.kill()
    deadline = time.monotonic() + 60
    while containers(service_name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers(service_name) == []
    second = Serve(tmp_path, service_name)
    try:
        with second.client("") as http:
            assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404
    finally:
        second.stop()


@pytest.mark.soak  # ~25 s (the reaper's 5 s interval): kept out of the default run's longest group
def test_re_adopted_sandboxes_no_client_claims_are_reaped_when_idle(tmp_path: Path, service_name: str) -> None:
    """The idle limit's clock of a re-adopted sandbox starts at the restart: one nobody asks
    for again (its client gave up while the service was down) does not wait for its TTL."""
    first = Serve(tmp_path, service_name)
    try:
        with first.client("") as http:
            claimed, forgotten = make(http), make(http)
    finally:
        first.kill()
    second = Serve(tmp_path, service_name, "--idle-timeout", "4")
    try:
        with second.client("") as http:
            deadline = time.monotonic() + 60
            while http.get(f"/sandboxes/{forgotten}").status_code != 404:
                assert time.monotonic() < deadline, "the unclaimed re-adopted sandbox was never reaped"
                assert run(http, claimed, "echo still-here")["stdout"] == "still-here\n"  # a call renews its clock
                time.sleep(1.0)
            assert run(http, claimed, "echo still-here")["stdout"] == "still-here\n"
            assert 'orchard_serve_deletes_total{key="local",reason="idle"} 1' in http.get("/metrics").text
            while len(containers(service_name)) != 1:  # its container's removal follows the 404
                assert time.monotonic() < deadline + 60, containers(service_name)
                time.sleep(0.2)
    finally:
        second.stop()
    assert containers(service_name) == []
