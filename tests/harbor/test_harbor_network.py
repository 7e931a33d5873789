"""Harbor's ``allowlist`` network mode against a server on this machine: the agent phase
reaches the allowlisted address and nothing else; setup and verification are offline."""

from __future__ import annotations

import http.server
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from orchard_async import ConfigError
from orchard_async.recipes import harbor
from orchard_async.recipes.harbor import config as cfg
from orchard_async.recipes.harbor.task import phase_networks
from tests.harbor.support import NETWORK, load, ready, run_sync

PAYLOAD = b"allowlisted-payload"



def test_harbor_modes_become_the_engines_phase_networks():
    public, offline = cfg.Network("public"), cfg.Network("no-network")
    assert phase_networks(public, public, public) is None  # online throughout: nothing to switch
    assert phase_networks(offline, offline, offline) is None  # offline throughout, likewise
    phases = phase_networks(offline, cfg.Network("allowlist", ("192.0.2.7", "198.51.100.0/24")), offline)
    assert (phases.setup.mode, phases.scoring.mode, phases.setup.allow, phases.scoring.allow) == (
        "restricted", "restricted", (), ()
    )  # fmt: skip
    assert [(r.cidr, r.port_start, r.port_end) for r in phases.agent.allow] == [
        ("192.0.2.7/32", 1, 65535), ("198.51.100.0/24", 1, 65535)
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="wildcard"):
        phase_networks(offline, cfg.Network("allowlist", ("*.example.com",)), offline)


def main_address() -> str | None:
    """This machine's own non-loopback IPv4 address (a UDP connect sends no packet)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


@contextmanager
def payload_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.soak
@pytest.mark.parametrize("adapter", ["local", "docker", "kubernetes"])
def test_allowlist_reaches_the_allowed_server_only(adapter, tmp_path, monkeypatch):
    ready(adapter)
    address = main_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to serve from")
    with payload_server() as port:
        monkeypatch.setenv("HARBOR_FIXTURE_URL", f"http://{address}:{port}/")
        for name, allowed in (("allowed", address), ("elsewhere", "192.0.2.1")):
            folder = tmp_path / name
            shutil.copytree(NETWORK / "allowlist", folder)
            toml = folder / "task.toml"
            toml.write_text(toml.read_text().replace("fixture-server", allowed))
        tasks = load(tmp_path)
        oracle = run_sync(tasks, harbor.make_policy("oracle"), adapter)
        empty = run_sync(load(tmp_path, ids=["allowed"]), harbor.make_policy("empty"), adapter)
    assert oracle["allowed"].reward == 1.0, oracle["allowed"].steps[0].observation[-500:]
    assert oracle["elsewhere"].reward == 0.0 and "urlopen" in oracle["elsewhere"].steps[0].observation
    assert empty["allowed"].reward == 0.0
