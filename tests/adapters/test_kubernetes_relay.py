"""The pod-IP relay (adapters/kubernetes/relay.py, podip.py) without a cluster: the relay
program runs here on loopback, as a pod's entry would start it. What only a cluster shows
(the route to a pod IP, the fallback, an API-server outage) is in test_kubernetes.py."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import orchard_async as oa

pytest.importorskip("kubernetes_asyncio")

from orchard_async.adapters.kubernetes import manifests, podip, relay  # noqa: E402
from orchard_async.adapters.kubernetes.transport import PodRef  # noqa: E402


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def relay_here() -> Iterator[tuple[int, str]]:
    """The relay program on a free loopback port: (port, its secret)."""
    port, secret = _free_port(), relay.new_secret()
    process = subprocess.Popen([sys.executable, "-c", relay.RELAY, str(port), relay.digest(secret)])
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port, secret
    finally:
        process.kill()
        process.wait()


async def _collect(connection: podip.RelayConnection) -> tuple[bytes, bytes, bytes]:
    out, err, code = b"", b"", b""
    while (message := await connection.read()) is not None:
        channel, data = message
        if channel == relay.STDOUT:
            out += data
        elif channel == relay.STDERR:
            err += data
        elif channel == relay.EXIT:
            code = data
    await connection.close()
    return out, err, code


async def test_the_relay_runs_a_command_for_the_right_secret_only(relay_here: tuple[int, str]) -> None:
    port, secret = relay_here
    command = ["sh", "-c", "echo out; echo err >&2; exit 3"]
    connection = await podip.connect_relay("127.0.0.1", port, secret, command, stdin=False)
    assert await _collect(connection) == (b"out\n", b"err\n", b"3")
    for wrong in ("", "x" * 64, secret[:-1], relay.digest(secret)):  # the digest the pod spec shows is no key
        with pytest.raises(podip.RelayRefused, match="wrong secret"):
            await podip.connect_relay("127.0.0.1", port, wrong, ["touch", "/tmp/never"], stdin=False)


async def test_stdin_and_its_eof_reach_the_process(relay_here: tuple[int, str]) -> None:
    port, secret = relay_here
    connection = await podip.connect_relay("127.0.0.1", port, secret, ["sh", "-c", "wc -c; exit 0"], stdin=True)
    await connection.write(b"x" * 300_000)
    connection.write_eof()
    out, _, code = await _collect(connection)
    assert (out.strip(), code) == (b"300000", b"0")


async def test_the_transport_falls_back_to_the_websocket_when_nothing_listens() -> None:
    class Fallback:  # records what the transport hands to the exec websocket
        name = "exec"
        opened: list[str] = []

        async def open_shell(self, pod: PodRef, command: list[str]) -> str:
            self.opened.append(pod.name)
            return "websocket"

    transport = podip.PodIpTransport(Fallback(), relay_port=_free_port())  # type: ignore[arg-type]
    transport._background = object()  # type: ignore[assignment]
    podip_wait, podip.RELAY_WAIT = podip.RELAY_WAIT, 0.2
    podip.IMAGES_WITHOUT_RELAY.discard("img-without-python")
    try:
        pod = PodRef("ns", "p1", "127.0.0.1", "s", "img-without-python")
        assert await transport.open_shell(pod, ["sh"]) == "websocket"
        assert transport.stats["fallback_no_relay"] == 1
        # the image is remembered: the next pod of it does not wait for a relay
        assert await transport.open_shell(PodRef("ns", "p2", "127.0.0.1", "s", "img-without-python"), ["sh"])
        assert transport.stats["fallback_not_tried"] == 1 and transport.stats["exec"] == 2
        assert Fallback.opened == ["p1", "p2"] and transport.stats["relay"] == 0
    finally:
        podip.RELAY_WAIT = podip_wait


def test_the_pod_spec_carries_the_secrets_digest_not_the_secret() -> None:
    secret = relay.new_secret()
    settings = manifests.PodSettings(attach_grace=60)
    pod = manifests.pod_manifest(
        "p", oa.SandboxSpec(ttl=100), "i", {}, settings, identity={}, owner="", relay=(relay.RELAY_PORT, secret)
    )
    text = repr(pod)
    assert secret not in text and hashlib.sha256(secret.encode()).hexdigest() in text
    command = pod["spec"]["containers"][0]["command"]
    # the relay goes first, then the timer exactly as without it
    assert command[:2] == ["sh", "-c"] and command[3] == "orchard-entry"
    plain = manifests.pod_manifest("p", oa.SandboxSpec(ttl=100), "i", {}, settings, identity={}, owner="")
    assert command[7:] == plain["spec"]["containers"][0]["command"]
    assert "python3" in command[2] and str(relay.RELAY_PORT) == command[5]
    assert repr(PodRef("ns", "p", "10.0.0.1", secret)).count(secret) == 0


def test_sandbox_pods_accept_connections_from_non_sandboxes_only() -> None:
    policy = manifests.relay_ingress_policy()["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"] == {"matchExpressions": [{"key": "orchard.sandbox", "operator": "Exists"}]}
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert source["namespaceSelector"] == {}  # a controller pod in any namespace
    assert source["podSelector"] == {"matchExpressions": [{"key": "orchard.sandbox", "operator": "DoesNotExist"}]}
