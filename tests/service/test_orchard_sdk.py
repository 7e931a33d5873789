"""Every call of Orchard Env's client (the stand-in of orchard_sdk.py), sync and async, against
the service on local (the default run), docker and kubernetes (the soak run; CI has both): what
Orchard's own server does, down to the work dir at /workspace that files and commands share, a
login shell that reads the profile and ~/.bashrc without bash's terminal warnings, and
commands that start with no signal ignored, whatever the service inherited."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
import requests

import orchard_async as oa
from tests.conftest import backend_missing, cluster_configured, docker_unready
from tests.service.conftest import Service
from tests.service.orchard_sdk import AsyncSandboxClient, SandboxClient

PATCH = "--- a/mod.txt\n+++ b/mod.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
DOCKER_IMAGE = "orchard/python:test"  # bash and GNU coreutils, as the images Orchard's users run
K8S_IMAGE = os.environ.get("ORCHARD_K8S_TEST_IMAGE", "local/busybox:1")
K8S_OPTIONS = {
    "image": K8S_IMAGE,
    "namespace": os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test"),
    **({"context": os.environ["ORCHARD_K8S_TEST_CONTEXT"]} if os.environ.get("ORCHARD_K8S_TEST_CONTEXT") else {}),
}
# A bashrc as images ship it: it returns at once unless the shell is interactive.
BASHRC = 'case $- in *i*) ;; *) return;; esac\nexport HISTCONTROL=ignoreboth FROM_BASHRC=yes\necho "bashrc ran" >&2\n'
PROFILE = "export FROM_PROFILE=yes\n"
# Trap -p lists what a bash command inherited; SigIgn is the kernel's word for the same.
SIGNALS_PROBE = "trap -p; grep -E '^SigIgn' /proc/self/status"
NO_SIGNAL_IGNORED = "SigIgn:\t0000000000000000\n"
# What an interactive bash (a login shell's -i) ignores itself, for want of job control:
# SIGTSTP, SIGTTIN, SIGTTOU. Nothing else may be ignored, nothing inherited.
INTERACTIVE_BASH_IGNORES = "SigIgn:\t0000000000380000\n"


@pytest.fixture
def nohup() -> Iterator[None]:
    """The service as `nohup` starts it: SIGHUP ignored, which a child inherits."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.fixture(
    params=["local", pytest.param("docker", marks=pytest.mark.soak), pytest.param("kubernetes", marks=pytest.mark.soak)]
)
async def sdk_service(
    request: pytest.FixtureRequest, nohup: None, start_service: Callable[..., Awaitable[Service]]
) -> tuple[Service, str]:
    backend = request.param
    if backend == "docker" and (reason := await docker_unready(DOCKER_IMAGE)):
        backend_missing(reason)
    if backend == "kubernetes" and not cluster_configured():
        backend_missing("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    # kubernetes too: ci-kubernetes.sh loads Docker's orchard/python:test into the node (bash is what
    # a login shell needs; the busybox default has none)
    image = {"local": "any", "docker": DOCKER_IMAGE, "kubernetes": DOCKER_IMAGE}[backend]
    options = K8S_OPTIONS if backend == "kubernetes" else {}
    try:
        return await start_service(backend, adapter_options=options), image
    except oa.AdapterUnavailable as exc:
        backend_missing(f"{backend}: {exc}")


def sync_whole_sdk(url: str, image: str, scratch: Path) -> None:
    client = SandboxClient(url, sandbox_prefix="sdk")
    assert client.health()["status"] == "healthy"
    sandbox = client.create_sandbox(image, sandbox_id="whole", timeout=600)
    assert sandbox.id == "sdk-whole"
    # The work dir is /workspace for commands and files alike.
    assert sandbox.exec("pwd").stdout == "/workspace\n"
    sandbox.upload_content(b"uploaded\n", "/workspace/x.txt")
    assert sandbox.exec("cat /workspace/x.txt").stdout == "uploaded\n"
    assert sandbox.exec("cat x.txt", cwd="/workspace").stdout == "uploaded\n"
    (scratch / "up.bin").write_bytes(bytes(range(256)))
    sandbox.upload_file(str(scratch / "up.bin"), "/tmp/deep/up.bin")
    assert sandbox.exec("wc -c </tmp/deep/up.bin").stdout.strip() == "256"
    assert sandbox.download_file("/tmp/deep/up.bin", str(scratch / "down.bin")) == 256
    assert (scratch / "down.bin").read_bytes() == bytes(range(256))
    root = {entry["name"]: entry["type"] for entry in sandbox.list_files()}  # the client's default: "/"
    assert root["workspace"] == root["tmp"] == root["etc"] == "directory"
    assert [entry["name"] for entry in sandbox.list_files("/workspace")] == ["x.txt"]
    # A login shell: the profile and ~/.bashrc, and no warnings about the terminal it lacks.
    home = sandbox.exec("echo $HOME").stdout.strip()
    sandbox.upload_content(BASHRC.encode(), f"{home}/.bashrc")
    sandbox.upload_content(PROFILE.encode(), f"{home}/.profile")
    login = sandbox.exec('echo "$FROM_PROFILE $FROM_BASHRC"; echo own >&2', login_shell=True)
    # (Debian's ~/.profile sources ~/.bashrc too; Orchard's login shell then reads it twice.)
    assert (login.exit_code, login.stdout) == (0, "yes yes\n"), login.raw
    assert set(login.stderr.splitlines()) == {"bashrc ran", "own"} and login.stderr.endswith("own\n"), login.raw
    plain = sandbox.exec('echo "${FROM_PROFILE:-no} ${FROM_BASHRC:-no}"')
    assert (plain.stdout, plain.stderr) == ("no no\n", "")
    checked = sandbox.check_env()
    assert checked["has_bashrc"] and checked["bashrc_loaded"], checked
    # No signal ignored in a command, though the service ignores SIGHUP (nohup) and the
    # sandbox's shell starts every command as a background job.
    assert sandbox.exec(SIGNALS_PROBE).stdout == NO_SIGNAL_IGNORED
    assert sandbox.exec(SIGNALS_PROBE, login_shell=True).stdout == INTERACTIVE_BASH_IGNORES
    assert sandbox.exec(SIGNALS_PROBE, env={"BASH_ENV": ""}).stdout == NO_SIGNAL_IGNORED  # a new bash each
    # wait=False: the client still asks the service to wait, and polls a job that is not done.
    queued = sandbox.exec("sleep 0.3; echo later", wait=False)
    while (polled := sandbox.get_job(queued.job_id)).status not in ("succeeded", "failed"):
        time.sleep(0.05)
    assert (polled.status, polled.stdout) == ("succeeded", "later\n")
    sandbox.upload_content(b"one\ntwo\nthree\n", "/workspace/mod.txt")
    assert sandbox.apply_patch(PATCH)["success"] is True
    assert sandbox.download_content("/workspace/mod.txt") == b"one\nTWO\nthree\n"
    assert sandbox.apply_patch(PATCH)["success"] is False
    sandbox.heartbeat()
    again = client.sandbox(sandbox.id)
    assert again.exec("cat x.txt").stdout == "uploaded\n"
    unwaited = client.create_unwaited(image)
    client.delete_sandbox(unwaited.id)
    client.delete_sandbox("sdk-never-made")  # errors ignored
    assert sandbox.delete()["status"] == "deleted"
    with pytest.raises(requests.HTTPError) as gone:
        client.get_sandbox(sandbox.id)
    assert gone.value.response.status_code == 404


async def test_the_sync_client_whole(sdk_service: tuple[Service, str], tmp_path: Path) -> None:
    service, image = sdk_service
    await anyio.to_thread.run_sync(sync_whole_sdk, service.url, image, tmp_path)


async def test_the_async_client_whole(sdk_service: tuple[Service, str], tmp_path: Path) -> None:
    service, image = sdk_service
    client = AsyncSandboxClient(service.url)
    try:
        assert (await client.health())["status"] == "healthy"
        sandbox = await client.create_sandbox(image, sandbox_id="async-whole")
        other = await client.create_sandbox(image)
        assert (await sandbox.exec("pwd")).stdout == "/workspace\n"
        await sandbox.upload_content(b"async\n", "/workspace/a.txt")
        assert (await sandbox.exec(["cat", "/workspace/a.txt"])).stdout == "async\n"
        await anyio.Path(tmp_path / "up.txt").write_bytes(b"from a file\n")
        await sandbox.upload_file(str(tmp_path / "up.txt"), "/tmp/up.txt")
        assert (await sandbox.exec("cat /tmp/up.txt")).stdout == "from a file\n"
        assert await sandbox.download_file("/tmp/up.txt", str(tmp_path / "down.txt")) == len(b"from a file\n")
        assert "workspace" in {entry["name"] for entry in await sandbox.list_files()}
        home = (await sandbox.exec("echo $HOME")).stdout.strip()
        await sandbox.upload_content(BASHRC.encode(), f"{home}/.bashrc")
        login = await sandbox.exec('echo "$FROM_BASHRC"', login_shell=True)
        assert login.stdout == "yes\n" and set(login.stderr.splitlines()) == {"bashrc ran"}, login.raw
        assert (await sandbox.check_env())["bashrc_loaded"]
        assert (await sandbox.exec(SIGNALS_PROBE)).stdout == NO_SIGNAL_IGNORED
        queued = await sandbox.exec("echo queued", wait=False)
        for _ in range(200):  # the client's own polling, every 50 ms
            if (polled := await sandbox.get_job(queued.job_id)).status in ("succeeded", "failed"):
                break
            await anyio.sleep(0.05)
        assert polled.stdout == "queued\n"
        await sandbox.upload_content(b"one\ntwo\nthree\n", "/workspace/mod.txt")
        assert (await sandbox.apply_patch(PATCH))["success"] is True
        assert (await sandbox.heartbeat())["status"] == "ok"
        assert (await (await client.get_sandbox(sandbox.id)).exec("cat a.txt")).stdout == "async\n"
        await client.delete_sandbox("never-made")  # errors ignored
        await anyio.to_thread.run_sync(other.delete_sync)
        assert client.tracked == {sandbox.id}
    finally:
        await client.close()  # DELETEs what is left
    async with service.client() as http:
        assert (await http.get("/sandboxes")).json()["sandboxes"] == []
