"""Docker-specific behaviour, against a real daemon: images and pull policy, what the
container is made of, limits, tmpfs and read-only roots, leaks after a SIGKILLed
controller, and a daemon that stalls or goes away mid-rollout.

The shared semantics (exec, files, sessions) are the conformance suite's. Without a daemon
these tests skip with the reason; in CI (CI=true) that is a failure. Every test counts
containers by its own run label, so other users of the daemon do not disturb it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async import ExitReason
from tests.conftest import backend_missing, require_docker

try:
    from orchard_async.adapters.docker import DockerAdapter
    from orchard_async.adapters.docker.config import KEEPALIVE
    from orchard_async.adapters.docker.container import PIDS_OVERHEAD
    from orchard_async.kit.exec_streams import ExecStream
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)
from orchard_async.images import ImageMissing, ImageSpec
from orchard_async.images import build as images
from orchard_async.recipes.toy import OraclePolicy, builtin_tasks

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("ORCHARD_DOCKER_TEST_IMAGE", "orchard/busybox:test")


@pytest.fixture(scope="module", autouse=True)
def docker_daemon() -> None:
    """Skip the module (fail it in CI) unless a daemon answers and has the test image."""
    require_docker(IMAGE)


@pytest.fixture
async def make_adapter() -> AsyncIterator[Callable[..., DockerAdapter]]:
    """Adapters with a fresh run id each; at the end each must have removed all it made."""
    made: list[DockerAdapter] = []

    def make(**options: object) -> DockerAdapter:
        adapter = DockerAdapter(image=IMAGE, run_id=f"t{uuid.uuid4().hex[:10]}", **options)  # type: ignore[arg-type]
        made.append(adapter)
        return adapter

    yield make
    for adapter in made:
        await adapter.close()
        assert await adapter.list_owned() == []
        assert await containers(adapter.run_id) == []


# -- helpers ----------------------------------------------------------------------------------


async def docker_cli(*args: str) -> str:
    result = await anyio.run_process(["docker", *args], check=False)
    return result.stdout.decode()


async def containers(run_id: str) -> list[str]:
    """Names of every container (running or not) with this run label."""
    out = await docker_cli("ps", "-a", "--filter", f"label=orchard.run={run_id}", "--format", "{{.Names}}")
    return sorted(out.split())


async def inspect(name: str) -> dict:
    return json.loads(await docker_cli("inspect", name))[0]


async def eventually(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    """Wait for a condition, polling, for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within:.0f}s: {what}")
        await anyio.sleep(0.2)


# -- images and pull policy --------------------------------------------------------------------


def test_options_are_a_checked_struct() -> None:
    """Bad options fail at construction with one line naming the option; by name through
    get_adapter too, which lists the struct's fields as the adapter's options."""
    from orchard_async.adapters.docker import DockerConfig
    from orchard_async.runtime import adapter_options

    for bad, field in (
        ({"keepalive": 0.5}, "keepalive"),
        ({"max_creating": 0}, "max_creating"),
        ({"tmpfs": "/x"}, "tmpfs"),
    ):
        with pytest.raises(oa.ConfigError, match=field) as caught:
            DockerAdapter(**bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(oa.ConfigError, match="no option 'imagee'"):
        oa.get_adapter("docker", imagee="x")
    assert set(DockerConfig.__struct_fields__) <= set(adapter_options(DockerAdapter)[0] or [])
    adapter = oa.get_adapter("docker", keepalive=0, tmpfs={"/scratch": "size=1m"}, run_id="r1")
    assert adapter.keepalive == 0 and adapter.run_id == "r1" and adapter.config.tmpfs == {"/scratch": "size=1m"}
    assert DockerAdapter(DockerConfig(exit_with_shell=False)).keepalive == 0  # no shell to watch: no keepalive


async def test_no_socket_is_an_outage_for_a_run_and_unavailable_for_doctor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """aiodocker asserts when it finds no socket (a daemon restarting): a create sees
    BackendUnavailable, which the pool retries, and doctor AdapterUnavailable; one line each."""
    import aiodocker.docker

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.docker/config.json: no docker context
    monkeypatch.setattr(aiodocker.docker, "_sock_search_paths", [tmp_path / "docker.sock"])
    adapter = DockerAdapter(image=IMAGE)
    try:
        with pytest.raises(oa.BackendUnavailable, match="no Docker socket found") as caught:
            await adapter.create(oa.SandboxSpec(ttl=30))
        assert "\n" not in str(caught.value)
        with pytest.raises(oa.AdapterUnavailable, match="no Docker socket found"):
            await adapter.doctor()
    finally:
        await adapter.close()


async def test_missing_image_with_pull_never_names_the_image_and_the_fix(make_adapter) -> None:
    adapter = make_adapter()
    with pytest.raises(ImageMissing, match=r"^image orchard/no-such-image:1 .*pull='never'.*docker pull") as caught:
        await adapter.create(oa.SandboxSpec(image="orchard/no-such-image:1", pull="never", ttl=60))
    assert isinstance(caught.value, oa.ConfigError) and not isinstance(caught.value, oa.InfraError)  # never retried
    assert "\n" not in str(caught.value)


async def test_an_image_that_cannot_be_pulled_is_a_config_error(make_adapter) -> None:
    adapter = make_adapter()
    # A registry that refuses connections at once: no network needed, no waiting.
    with pytest.raises(ImageMissing, match=r"localhost:1/orchard/nope:1.*could not be pulled.*docker pull"):
        await adapter.create(oa.SandboxSpec(image="localhost:1/orchard/nope:1", ttl=60))


async def test_a_missing_buildable_image_names_the_build_command_once_per_adapter(
    make_adapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image `orchard-async images build` makes is on no registry: no pull is tried, the
    error names the command, and later creates get the same answer without asking the daemon."""
    tag = f"orchard/absent-{uuid.uuid4().hex[:8]}:test"
    monkeypatch.setattr(images, "TEST_IMAGES", [*images.TEST_IMAGES, ImageSpec(tag=tag, base="busybox")])
    adapter = make_adapter()
    asked: list[str] = []
    present = adapter.api.image_present

    async def counting(image):  # type: ignore[no-untyped-def]
        asked.append(image)
        return await present(image)

    monkeypatch.setattr(adapter.api, "image_present", counting)
    expected = rf"^image {tag} is not on the Docker daemon.*`orchard-async images build {tag}`$"
    for pull in ("missing", "missing", "never", "never"):
        with pytest.raises(ImageMissing, match=expected):
            await adapter.create(oa.SandboxSpec(image=tag, pull=pull, ttl=60))
    assert asked == [tag, tag]  # once per image and pull policy
    assert await containers(adapter.run_id) == []


async def test_the_recipe_image_is_named_by_the_plain_build_command(make_adapter, monkeypatch) -> None:
    """The SWE recipe's image (what `demo --adapter docker` runs) is built by `images build` alone."""
    from orchard_async.recipes import swe

    tag = swe.IMAGES[0].tag
    adapter = make_adapter()

    async def absent(image):  # type: ignore[no-untyped-def]
        return False

    monkeypatch.setattr(adapter.api, "image_present", absent)
    with pytest.raises(ImageMissing, match=rf"^image {tag} .*build it with `orchard-async images build`$"):
        await adapter.create(oa.SandboxSpec(image=tag, ttl=60))


async def test_pull_always_pulls_even_a_local_image(make_adapter) -> None:
    adapter = make_adapter()
    # The test image exists only locally, so a pull (from Docker Hub) must fail: proof it was tried.
    with pytest.raises(oa.ConfigError, match="could not be pulled"):
        await adapter.create(oa.SandboxSpec(image=IMAGE, pull="always", ttl=60))


async def test_a_spec_the_daemon_refuses_is_a_config_error(make_adapter) -> None:
    with pytest.raises(oa.ConfigError, match="Minimum memory"):
        await make_adapter().create(oa.SandboxSpec(memory="1Mi", ttl=60))


# -- what a container is made of -----------------------------------------------------------------


async def test_labels_limits_init_timer_and_no_network(make_adapter) -> None:
    adapter = make_adapter()
    spec = oa.SandboxSpec(cpu=0.5, memory="64Mi", pids=20, ttl=90, labels={"team": "orchard"}, env={"FOO": "bar"})
    box = await adapter.create(spec)
    info = await inspect(box.id)
    labels, host = info["Config"]["Labels"], info["HostConfig"]
    assert labels["team"] == "orchard"
    assert labels["orchard.run"] == adapter.run_id and labels["orchard.owner"] == adapter.owner
    assert abs(int(labels["orchard.expires"]) - (time.time() + 90)) < 30
    assert labels["orchard.controller"].startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert host["NetworkMode"] == "none"
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 64 * 1024**2
    assert host["PidsLimit"] == 20 + PIDS_OVERHEAD
    assert host["Init"] is True and host["AutoRemove"] is True
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert host["SecurityOpt"] == ["no-new-privileges"]
    # the timer: attach grace, rest of the TTL, the shell's pid file, no reattach grace
    assert info["Config"]["Entrypoint"][:2] == ["sh", "-c"]
    assert info["Config"]["Cmd"] == ["60", "30", "/tmp/.orchard/shell.pid", "0"]
    assert info["Config"]["OpenStdin"] is True and info["Config"]["StdinOnce"] is True  # the controller watch
    result = await box.exec('tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " "; echo "$FOO"; pwd')
    assert result.text.split() == ["lo", "bar", "/workspace"]
    status = (await box.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status")).text.split()
    assert status == ["CapEff:", "0000000000000000", "CapBnd:", "0000000000000000", "NoNewPrivs:", "1"]
    assert box.id in await adapter.list_owned()
    await box.close()
    assert await containers(adapter.run_id) == []


async def test_no_network_is_runcs_own_namespace_with_docker_hosts(make_adapter) -> None:
    """light_network (the default): no libnetwork sandbox (NetworkDisabled), loopback only,
    localhost resolving as with docker's network "none", /etc/hosts read-only for the sandbox;
    light_network=False is the daemon's network "none", its /etc/hosts writable."""
    script = (
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; grep -c localhost /etc/hosts; "
        "if echo '10.0.0.1 x' >> /etc/hosts; then echo writable; else echo read-only; fi"
    )
    light = await make_adapter().create(oa.SandboxSpec(ttl=60))
    info = await inspect(light.id)
    assert info["Config"].get("NetworkDisabled") is True and info["HostConfig"]["NetworkMode"] == "none"
    assert (await light.exec("cat /etc/hosts")).text.splitlines()[0].split() == ["127.0.0.1", "localhost"]
    assert (await light.exec(script)).text.split() == ["lo", "2", "read-only"]
    classic = await make_adapter(light_network=False).create(oa.SandboxSpec(ttl=60))
    assert not (await inspect(classic.id))["Config"].get("NetworkDisabled")
    assert (await classic.exec(script)).text.split() == ["lo", "2", "writable"]


async def test_a_daemon_that_cannot_bind_our_hosts_file_gets_network_none(make_adapter, tmp_path: Path) -> None:
    """Where the daemon does not see this machine's files (another host, a VM), the bind is
    refused: the adapter falls back to docker's network "none" for the rest of its life."""
    adapter = make_adapter()
    adapter._hosts_dir = str(tmp_path)  # no hosts file there: as a daemon elsewhere would find it
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    assert not (await inspect(box.id))["Config"].get("NetworkDisabled")
    assert (await box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")).text.split() == ["lo"]
    assert not adapter._light_network


async def test_network_on_when_asked(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(network="on", ttl=60))
    assert (await inspect(box.id))["HostConfig"]["NetworkMode"] == "bridge"
    interfaces = await box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert "eth0" in interfaces.text.split()
    await box.close()


async def test_a_workdir_the_image_cannot_have_is_a_config_error(make_adapter) -> None:
    with pytest.raises(oa.ConfigError, match="could not create /proc/orchard"):
        await make_adapter().create(oa.SandboxSpec(workdir="/proc/orchard", ttl=60))


async def test_output_fifos_the_image_cannot_make_are_a_config_error(make_adapter) -> None:
    """The relays in the container's main process say why they could not make their FIFOs."""
    adapter = make_adapter(tmpfs={"/tmp/.orchard/out": "ro"})
    with pytest.raises(oa.ConfigError, match=r"could not create its output FIFO .*Read-only file system") as caught:
        await adapter.create(oa.SandboxSpec(ttl=60))
    assert "\n" not in str(caught.value)
    assert await containers(adapter.run_id) == []


async def test_workdir_from_the_spec_is_created(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(workdir="/srv/deep/work", ttl=60))
    assert (await box.exec("pwd")).text == "/srv/deep/work\n"
    await box.write_file("f.txt", "x")
    assert await box.read_file("/srv/deep/work/f.txt") == b"x"
    await box.close()


# -- limits ------------------------------------------------------------------------------------------


async def test_memory_kill_is_reported_as_oom(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(memory="32Mi", ttl=60))
    hog = await box.exec("dd if=/dev/zero of=/dev/null bs=64M count=1", timeout=30)
    assert (hog.exit_code, hog.reason) == (137, ExitReason.OOM)
    # A SIGKILL that is not the OOM killer's stays what it was.
    killed = await box.exec("sh -c 'kill -KILL $$'")
    assert killed.exit_code == 137 and killed.reason is not ExitReason.OOM
    assert (await box.exec("echo alive")).text == "alive\n"
    await box.close()


async def test_pids_limit_holds(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(pids=10, ttl=60))
    # Fork short sleeps until refused; how many started is left in a file.
    flood = await box.exec("n=0; while [ $n -lt 50 ]; do sleep 3 & n=$((n+1)); echo $n > started; done", timeout=30)
    assert not flood.ok and "fork" in flood.error_text

    async def answers() -> bool:  # once the sleeps end: the adapter's own processes survived
        return (await box.exec("cat started")).ok

    await eventually(answers, 15, "the sandbox runs commands again")
    started = int((await box.read_file("started")).decode())
    assert 10 - 1 <= started < 50
    await box.close()


async def test_a_timeout_is_delivered_even_when_the_pids_limit_is_full(make_adapter) -> None:
    """The interrupt needs no new process in the container (a signal relayed by the timer)."""
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(pids=10, ttl=60))
    # Fill every pid with short sleeps, then spin on builtins only: nothing can fork now.
    hog = await box.exec("(while :; do sleep 3 & done) 2>/dev/null; while :; do :; done", timeout=2)
    assert hog.reason is ExitReason.TIMEOUT and hog.duration < 10

    async def answers() -> bool:
        return (await box.exec("cat /dev/null")).ok

    await eventually(answers, 15, "the sandbox runs commands again")
    await box.close()


# -- file systems ------------------------------------------------------------------------------------


async def test_file_ops_on_a_tmpfs_path(make_adapter) -> None:
    adapter = make_adapter(tmpfs={"/scratch": "size=16m"})
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    blob = bytes(range(256)) * 64
    await box.write_file("/scratch/data/blob.bin", blob)
    await box.write_file("/scratch/run.sh", "#!/bin/sh\necho ran from tmpfs\n", mode=0o755)
    assert await box.read_file("/scratch/data/blob.bin") == blob
    assert {entry.name for entry in await box.list_dir("/scratch")} == {"data", "run.sh"}
    assert (await box.exec("/scratch/run.sh")).text == "ran from tmpfs\n"  # mounted exec, unlike Docker's default
    assert "tmpfs" in (await box.exec("grep ' /scratch ' /proc/mounts")).text
    await box.close()


async def test_file_ops_with_a_read_only_root(make_adapter) -> None:
    adapter = make_adapter(read_only=True)
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    await box.write_file("src/mod.txt", "one\ntwo\n")
    assert await box.read_file("src/mod.txt") == b"one\ntwo\n"
    assert [entry.name for entry in await box.list_dir("src")] == ["mod.txt"]
    patch = "--- a/src/mod.txt\n+++ b/src/mod.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
    assert (await box.apply_patch(patch)).ok
    assert await box.read_file("src/mod.txt") == b"one\nTWO\n"
    with pytest.raises(OSError, match="Read-only file system"):
        await box.write_file("/etc/orchard-test", "x")
    assert (await box.exec("touch /orchard-test")).reason is ExitReason.NONZERO
    await box.close()


# -- connection --------------------------------------------------------------------------------------


async def test_docker_host_is_honoured(make_adapter, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    adapter = make_adapter()
    with pytest.raises(oa.BackendUnavailable, match="no-daemon.sock.*DOCKER_HOST"):
        await adapter.create(oa.SandboxSpec(ttl=60))
    with pytest.raises(oa.AdapterUnavailable, match="no-daemon.sock"):
        await adapter.doctor()


async def test_a_stalled_daemon_is_a_bounded_backend_error(make_adapter, tmp_path: Path) -> None:
    """A daemon that accepts connections and never answers (as a hung dockerd does)."""
    path = tmp_path / "stalled.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(64)
    try:
        adapter = make_adapter(url=f"unix://{path}", api_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(oa.BackendUnavailable, match="did not answer"):
            await adapter.create(oa.SandboxSpec(ttl=60))
        assert time.monotonic() - started < 10
    finally:
        listener.close()


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_more_live_sandboxes_than_an_http_connection_pool(make_adapter) -> None:
    """Each live sandbox holds one connection (its exec stream): aiohttp's default pool of
    100 would make the 101st create wait forever."""
    adapter = make_adapter(max_creating=8)
    boxes: list[oa.Sandbox] = []

    async def create() -> None:
        boxes.append(await adapter.create(oa.SandboxSpec(ttl=300)))

    with anyio.fail_after(240):
        async with anyio.create_task_group() as group:
            for _ in range(105):
                group.start_soon(create)
        results = [await box.exec("echo ok") for box in boxes]
    assert all(result.text == "ok\n" for result in results)
    await adapter.close()


# -- leaks: a controller killed with SIGKILL ---------------------------------------------------------

CONTROLLER = textwrap.dedent(
    """
    import functools, json, os, signal, sys
    import anyio
    import orchard_async as oa
    from orchard_async.adapters.docker import DockerAdapter
    from orchard_async.recipes.toy import OraclePolicy, builtin_tasks

    mode, out, ttl, options = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4])
    count = int(sys.argv[5])

    class SlowOracle(OraclePolicy):
        async def act(self, observation):
            await anyio.sleep(2)
            return await super().act(observation)

    class DiesBeforeAttaching(DockerAdapter):
        async def _open_shell(self, *args, **keywords):
            os.kill(os.getpid(), signal.SIGKILL)

    class DiesBeforeStarting(DockerAdapter):
        async def _start_container(self, name, config):
            await self.api.create_container(name, config)
            os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        if mode == "rollout":
            await oa.collect(builtin_tasks(), SlowOracle(), DockerAdapter(**options), out, n=8, concurrency=4)
        elif mode in ("hold", "busy"):
            adapter = DockerAdapter(**options)
            async with anyio.create_task_group() as commands:
                async def hold():
                    box = await adapter.create(oa.SandboxSpec(ttl=ttl))
                    if mode == "busy":  # the shell runs a command: it reads none of the controller's bytes
                        commands.start_soon(functools.partial(box.exec, "sleep 600", timeout=700))
                async with anyio.create_task_group() as creates:
                    for _ in range(count):
                        creates.start_soon(hold)
                await anyio.sleep(0.5)  # the commands started
                open(out + ".ready", "w").close()  # every shell attached: only the keepalive or EOF ends them now
                await anyio.sleep(3600)
        elif mode == "die-before-start":
            await DiesBeforeStarting(**options).create(oa.SandboxSpec(ttl=ttl))
        else:
            await DiesBeforeAttaching(**options).create(oa.SandboxSpec(ttl=ttl))

    anyio.run(main)
    """
)


def start_controller(tmp_path: Path, mode: str, ttl: float, options: dict, count: int = 3) -> subprocess.Popen:
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    argv = [sys.executable, str(script), mode, str(tmp_path / "t.jsonl"), str(ttl), json.dumps(options), str(count)]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("wb"))


async def start_controller_with_containers(
    tmp_path: Path, mode: str, *, ttl: float = 60, count: int = 3, **options: object
) -> tuple[str, subprocess.Popen]:
    """Run a controller in a subprocess until it has ``count``+ containers (in "hold" and
    "busy" modes: until all have their shells attached); its run id and process."""
    run_id = f"t{uuid.uuid4().hex[:10]}"
    process = start_controller(tmp_path, mode, ttl, {"image": IMAGE, "run_id": run_id, **options}, count)
    try:

        async def has_containers() -> bool:
            assert process.poll() is None, f"the controller died: {(tmp_path / 'stderr').read_text()}"
            if mode in ("hold", "busy") and not (tmp_path / "t.jsonl.ready").exists():
                return False
            return len(await containers(run_id)) >= count

        await eventually(has_containers, 60, "the controller started 3 containers")
    except BaseException:
        process.kill()
        process.wait()
        raise
    return run_id, process


async def start_and_kill_controller(
    tmp_path: Path, mode: str, *, ttl: float = 60, count: int = 3, **options: object
) -> str:
    """Run a controller in a subprocess until it has ``count``+ containers, SIGKILL it; its run id."""
    run_id, process = await start_controller_with_containers(tmp_path, mode, ttl=ttl, count=count, **options)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return run_id


def none_left(run_id: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await containers(run_id) == []

    return check


def none_running(run_id: str) -> Callable[[], Awaitable[bool]]:
    """No container of the run is running (one the daemon is still removing has ended)."""

    async def check() -> bool:
        out = await docker_cli(
            "ps", "--filter", f"label=orchard.run={run_id}", "--filter", "status=running", "--format", "{{.Names}}"
        )
        return out.split() == []

    return check


# A daemon under load takes seconds to remove a container whose processes are already dead.
REMOVAL_SLACK = 20.0


async def test_sigkilled_rollout_leaves_nothing_behind(tmp_path: Path) -> None:
    """The README's promise: a dead controller's sandboxes have ended within KEEPALIVE (6 s),
    whatever state the kill caught each in, and are then removed; no TTL, no reap."""
    run_id = await start_and_kill_controller(tmp_path, "rollout")
    await eventually(none_running(run_id), KEEPALIVE, "containers of the killed controller have ended")
    await eventually(none_left(run_id), REMOVAL_SLACK, "containers of the killed controller are removed")


async def test_a_sigkilled_controllers_idle_sandboxes_go_within_seconds(tmp_path: Path) -> None:
    """Idle sandboxes (no command running) of a controller killed by SIGKILL: the EOF of
    their streams or, at the latest, the keepalive ends them; no reap, no TTL."""
    keepalive = 3
    run_id = await start_and_kill_controller(tmp_path, "hold", ttl=600, keepalive=keepalive)
    await eventually(none_left(run_id), keepalive + 10, "containers of the killed controller are gone")


async def test_a_frozen_controller_loses_its_sandboxes_to_the_keepalive(tmp_path: Path) -> None:
    """SIGSTOP: the controller's connections stay open, so no EOF reaches the containers;
    only the keepalive (no heartbeat for `keepalive` seconds) can end them."""
    keepalive = 3
    run_id, process = await start_controller_with_containers(tmp_path, "hold", ttl=600, keepalive=keepalive)
    process.send_signal(signal.SIGSTOP)
    try:
        await eventually(none_left(run_id), keepalive + 10, "containers of the frozen controller are gone")
        assert process.poll() is None  # still there, stopped, its exec streams open
    finally:
        process.kill()
        process.wait()


async def test_idle_sandboxes_outlive_the_keepalive_while_their_controller_lives(make_adapter) -> None:
    adapter = make_adapter(keepalive=1)
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    await anyio.sleep(4)  # four keepalive periods with no command: only heartbeats reach it
    assert (await box.exec("echo alive")).text == "alive\n"
    await box.close()


async def test_the_keepalive_survives_a_full_pids_limit(make_adapter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog forks nothing per tick, so a command that takes every pid does not
    disable it: once the heartbeats stop, the container still ends."""
    adapter = make_adapter(keepalive=2)
    box = await adapter.create(oa.SandboxSpec(pids=10, ttl=60))
    flood = await box.exec("while :; do sleep 4 & done", timeout=20)
    assert not flood.ok and "fork" in flood.error_text  # every pid was taken

    async def answers() -> bool:
        return (await box.exec("cat /dev/null")).ok

    await eventually(answers, 15, "the sandbox runs commands again")

    async def silent(self: ExecStream, limit: float) -> None:
        return None

    monkeypatch.setattr(ExecStream, "beat", silent)
    await anyio.sleep(6)  # three keepalive periods without a heartbeat
    result = await box.exec("echo alive", timeout=5)
    assert result.reason is ExitReason.SANDBOX_LOST
    await eventually(none_left(adapter.run_id), 20, "the silent sandbox's container is gone")
    await box.close()


async def run_controller_that_dies(tmp_path: Path, mode: str, **options: object) -> str:
    """A controller that SIGKILLs itself mid-create (``mode``); its run id, once it is dead."""
    run_id = f"t{uuid.uuid4().hex[:10]}"
    process = start_controller(tmp_path, mode, 600, {"image": IMAGE, "run_id": run_id, **options})
    await eventually(lambda: anyio.to_thread.run_sync(lambda: process.poll() is not None), 60, "the controller died")
    assert process.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    return run_id


async def test_a_controller_killed_before_its_shell_attached_leaves_nothing(tmp_path: Path) -> None:
    """Started, no shell yet: the controller watch on the container's stdin ends it, not the
    attach grace (an hour here)."""
    run_id = await run_controller_that_dies(tmp_path, "die-mid-create", attach_grace=3600)
    await eventually(none_running(run_id), KEEPALIVE, "the unattached container ended itself")
    await eventually(none_left(run_id), REMOVAL_SLACK, "the unattached container was removed")


async def test_a_controller_killed_between_create_and_start_leaves_nothing(tmp_path: Path) -> None:
    """Created, never started: nothing runs in it, so the adapter's guardian removes it."""
    run_id = await run_controller_that_dies(tmp_path, "die-before-start")
    await eventually(none_left(run_id), KEEPALIVE + REMOVAL_SLACK, "the never-started container was removed")


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_many_busy_sandboxes_of_a_sigkilled_controller_end_within_the_documented_time(tmp_path: Path) -> None:
    """16 sandboxes, each running a command (its shell reads nothing), end at once: all are
    gone within the README's 6 s, without reap."""
    run_id = await start_and_kill_controller(tmp_path, "busy", ttl=600, count=16)
    await eventually(none_running(run_id), KEEPALIVE, "containers of the killed controller have ended")
    await eventually(none_left(run_id), REMOVAL_SLACK, "containers of the killed controller are removed")


async def alive_for(run_id: str, count: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = await docker_cli("ps", "-a", "--filter", f"label=orchard.run={run_id}", "--format", "{{.State}}")
        assert states.split() == ["running"] * count, f"ended inside the reattach grace: {states.split()}"
        await anyio.sleep(0.5)


@pytest.mark.soak
async def test_with_a_reattach_grace_a_killed_controllers_sandboxes_live_the_grace_then_end(tmp_path: Path) -> None:
    grace = 10
    run_id = await start_and_kill_controller(tmp_path, "busy", ttl=600, count=3, reattach_grace=grace)
    killed_at = time.monotonic()
    await alive_for(run_id, 3, grace - 2 - (time.monotonic() - killed_at))
    await eventually(none_left(run_id), KEEPALIVE + 2, "the sandboxes ended after their grace")


@pytest.mark.soak
async def test_with_a_reattach_grace_an_unattached_sandbox_lives_the_grace_then_ends(tmp_path: Path) -> None:
    """Its controller died before the shell attached: the controller watch waits the grace
    (a new controller may attach), not the attach grace, then ends it."""
    grace = 8
    run_id = await run_controller_that_dies(tmp_path, "die-mid-create", attach_grace=3600, reattach_grace=grace)
    died_at = time.monotonic()
    await alive_for(run_id, 1, grace - 2 - (time.monotonic() - died_at))
    await eventually(none_left(run_id), KEEPALIVE + 2, "the unattached container ended after the grace")


async def running(run_id: str) -> set[str]:
    out = await docker_cli(
        "ps", "--filter", f"label=orchard.run={run_id}", "--filter", "status=running", "--format", "{{.Names}}"
    )
    return set(out.split())


async def test_reap_removes_a_dead_controllers_containers_at_once(tmp_path: Path) -> None:
    # "hold": every container started and its shell attached before the kill (a rollout may be
    # killed with one only created, which the adapter's guardian then removes before reap).
    run_id = await start_and_kill_controller(tmp_path, "hold", exit_with_shell=False)
    alive = await running(run_id)
    assert len(alive) >= 3  # kept alive (until their TTL) by exit_with_shell=False
    reaper = DockerAdapter(image=IMAGE)
    try:
        removed = await reaper.reap()
    finally:
        await reaper.close()
    assert alive <= set(removed)
    assert await containers(run_id) == []


async def test_nothing_outlives_its_ttl(tmp_path: Path) -> None:
    # Long enough that the three outlive the kill even when a loaded machine is slow to make them.
    ttl = 10.0
    run_id = await start_and_kill_controller(tmp_path, "hold", ttl=ttl, exit_with_shell=False)
    killed_at = time.monotonic()
    assert len(await containers(run_id)) == 3
    await eventually(none_left(run_id), ttl + 20, "containers removed at their TTL")
    assert time.monotonic() - killed_at > 1  # they lived on after the kill: the timer ended them


async def test_reap_leaves_live_controllers_alone(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=120))
    reaper = DockerAdapter(image=IMAGE)
    try:
        assert box.id not in await reaper.reap()
    finally:
        await reaper.close()
    assert (await box.exec("echo alive")).text == "alive\n"
    await box.close()


# -- the daemon goes away mid-rollout ---------------------------------------------------------------


async def run_script(name: str, attempts: int = 3) -> None:
    """Run scripts/NAME; retry, since another user of the daemon (a second test run, CI)
    may be starting it at the same moment and win the race."""
    for _ in range(attempts):
        done = await anyio.run_process([str(REPO / "scripts" / name)], check=False)
        if done.returncode == 0:
            return
    pytest.fail(f"scripts/{name} failed {attempts} times: {done.stdout.decode()}{done.stderr.decode()}")


DOCKERD_PIDFILE = Path(os.environ.get("ORCHARD_DOCKERD_PID", "/tmp/orchard-dockerd.pid"))


def dockerd_started_by_script() -> bool:
    return DOCKERD_PIDFILE.exists()


def dockerd_network_namespace() -> str:
    """The network namespace of the dockerd that docker-up.sh started."""
    return os.readlink(f"/proc/{DOCKERD_PIDFILE.read_text().strip()}/ns/net")


class SlowOracle(OraclePolicy):
    async def act(self, observation):  # type: ignore[no-untyped-def]
        await anyio.sleep(0.5)
        return await super().act(observation)


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_daemon_restart_mid_rollout_accounts_for_every_episode(tmp_path: Path) -> None:
    """Runs last in this module: it stops and restarts dockerd (scripts/docker-down.sh and
    docker-up.sh), so it only runs where docker-up.sh started the daemon."""
    if not dockerd_started_by_script():
        backend_missing("dockerd was not started by scripts/docker-up.sh, so this test cannot stop it")
    adapter = DockerAdapter(image=IMAGE, run_id=f"t{uuid.uuid4().hex[:10]}")
    trajectories: list[oa.Trajectory] = []
    n = 24
    # CI runs this inside the private network namespace of its Kubernetes cluster
    # (ci-kubernetes.sh run): the restarted dockerd must still be in the host's, where the
    # first one was started, or it would lose its networking when that namespace goes.
    host_namespace = dockerd_network_namespace()

    async def outage() -> None:
        async def some_running() -> bool:
            return len(await containers(adapter.run_id)) >= 4

        await eventually(some_running, 60, "the rollout has sandboxes running")
        await run_script("docker-down.sh")
        await run_script("docker-up.sh")
        assert dockerd_network_namespace() == host_namespace, "dockerd restarted outside the host's network namespace"

    try:
        with anyio.fail_after(600):  # no hang
            async with anyio.create_task_group() as group:
                group.start_soon(outage)
                pool = oa.Pool(adapter, max_backoff=2.0)  # retry soon after the daemon is back
                stream = oa.rollout(builtin_tasks(), SlowOracle(), pool, n=n, concurrency=8, max_retries=3)
                async for trajectory in stream:
                    trajectories.append(trajectory)
    finally:
        await adapter.close()
    assert sorted(t.episode_id for t in trajectories) == sorted({t.episode_id for t in trajectories})
    assert len(trajectories) == n  # none lost
    for trajectory in trajectories:
        assert trajectory.status in ("finished", "failed")
        if trajectory.status == "failed":
            assert trajectory.end_reason and trajectory.error
    assert any(t.retries or t.status == "failed" for t in trajectories), "the outage touched no episode"
    assert any(t.success for t in trajectories)
    assert await adapter.list_owned() == []

    await eventually(none_left(adapter.run_id), 30, "no container of the rollout is left")


def test_gpus_are_a_device_request_as_docker_run_gpus_makes_it() -> None:
    from orchard_async.adapters.docker.config import DockerConfig
    from orchard_async.adapters.docker.container import container_config

    def host(spec: oa.SandboxSpec) -> dict:
        config = container_config(
            DockerConfig(), spec, "i", {}, workdir="/workspace", relays_in_main=False, reattach_grace=0, hosts_file=None
        )
        return config["HostConfig"]

    assert host(oa.SandboxSpec(gpus=2))["DeviceRequests"] == [
        {"Driver": "", "Count": 2, "DeviceIDs": None, "Capabilities": [["gpu"]]}
    ]
    assert "DeviceRequests" not in host(oa.SandboxSpec())


async def test_gpus_are_checked_against_what_the_daemon_offers(make_adapter, monkeypatch) -> None:
    adapter = make_adapter()
    for info, wanted, refused in (
        ({"Runtimes": {"runc": {}}}, 1, "no GPU to give"),
        ({"Runtimes": {"runc": {}, "nvidia": {}}}, 4, None),
        ({"Runtimes": {}, "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}, 1, None),
        ({"Runtimes": {}, "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}, 2, "has 1 GPU"),
    ):

        async def answer(info: dict = info) -> dict:
            return info

        monkeypatch.setattr(adapter.api, "info", answer)
        adapter._gpus = None
        if refused:
            with pytest.raises(oa.ConfigError, match=refused):
                await adapter._check_gpus(wanted)
        else:
            await adapter._check_gpus(wanted)
