"""OpenEnv and MCP servers inside sandboxes without network, with the real packages (issue 27):

* ``orchard_async.openenv.OrchardProvider`` under openenv-core's own ``GenericEnvClient``
  (``from_docker_image(image, provider=...)``): a real OpenEnv environment server (openenv-core's
  ``create_app``) in a local sandbox; the standard-library OpenEnv-style server
  (``inside/env_server.py``) in a docker and a kubernetes one;
* a real MCP server (the ``mcp`` package's streamable HTTP) in a local sandbox, driven by the
  ``mcp`` client through ``serve --services``' URL.

Soak run only: importing openenv-core takes ~10 s (it loads gradio), and the servers as long
inside the sandbox."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.service.conftest import Service
from tests.service.test_services import BACKENDS, SERVER, backend_ready

pytestmark = pytest.mark.soak


def need_openenv() -> None:
    """In the test, not at collection: importing openenv-core costs ~10 s of every worker's
    collection of the default run, which leaves these tests out anyway."""
    pytest.importorskip("openenv.core", reason="openenv-core: pip install -e '.[openenv]'")


# openenv-core's own server: an echo environment, as `openenv init` makes one
ECHO_APP = """
from uuid import uuid4
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, **_):
        self._state = State(episode_id=str(uuid4()), step_count=0)
        return EchoObservation(echoed="ready", done=False, reward=0.0)

    def step(self, action, **_):
        self._state.step_count += 1
        return EchoObservation(echoed=action.message, done=False, reward=float(len(action.message)))

    @property
    def state(self):
        return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo")
"""

MCP_APP = """
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("sandboxed")


@server.tool()
def add(a: int, b: int) -> int:
    return a + b


server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True)
"""


async def test_an_openenv_server_in_an_offline_local_sandbox_through_the_provider() -> None:
    need_openenv()
    from openenv.core import GenericEnvClient

    from orchard_async.openenv import OrchardProvider

    provider = OrchardProvider(
        "local",
        command=f"{sys.executable} -m uvicorn app:app --host 127.0.0.1 --port {{port}}",
        files={"app.py": ECHO_APP},
    )
    provider.wait_for_ready = with_timeout(provider.wait_for_ready, 180)  # type: ignore[method-assign]
    env = await GenericEnvClient.from_docker_image("unused-by-local", provider=provider)
    try:
        assert provider.base_url and provider.base_url.startswith("http://127.0.0.1:")
        reset = await env.reset()
        assert reset.observation["echoed"] == "ready"
        stepped = await env.step({"message": "hello"})
        assert stepped.observation["echoed"] == "hello" and stepped.reward == 5.0
        assert (await env.state())["step_count"] == 1
        async with httpx.AsyncClient(base_url=provider.base_url, timeout=30) as http:  # and plain HTTP
            assert (await http.get("/health")).status_code == 200
        probe = f"{sys.executable} -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)'"
        offline = await anyio.to_thread.run_sync(provider.call, provider.sandbox.exec, probe)  # type: ignore[union-attr]
        assert not offline.ok
        url = provider.base_url
    finally:
        await env.close()  # stops the provider
    assert provider.sandbox is None
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(timeout=5) as http:
            await http.get(f"{url}/health")


def with_timeout(wait: Callable[..., None], seconds: float) -> Callable[..., None]:
    """OpenEnv waits 30 s; importing openenv-core in a sandbox on a loaded 2-core machine can
    take most of that."""
    return lambda base_url, timeout_s=30.0: wait(base_url, max(timeout_s, seconds))


@pytest.mark.parametrize("adapter", ["docker", "kubernetes"])
async def test_the_provider_on_a_container_adapter(adapter: str) -> None:
    need_openenv()
    from openenv.core import GenericEnvClient

    from orchard_async.openenv import OrchardProvider

    await backend_ready(adapter)
    options = {k: v for k, v in BACKENDS[adapter].items() if k != "image"}
    provider = OrchardProvider(
        adapter, options, command="python3 env_server.py {port}", files={"env_server.py": SERVER}
    )
    env = await GenericEnvClient.from_docker_image(BACKENDS[adapter]["image"], provider=provider)
    try:
        assert (await env.reset()).observation["message"] == "ready"
        stepped = await env.step({"message": "four"})
        assert stepped.reward == 4.0 and stepped.observation["step"] == 1
    finally:
        await env.close()
    assert provider.sandbox is None


async def test_a_real_mcp_server_in_an_offline_sandbox_through_a_service_url(
    start_service: Callable[..., Awaitable[Service]],
) -> None:
    pytest.importorskip("mcp", reason="mcp: pip install -e '.[mcp]'")
    from mcp import ClientSession

    try:
        from mcp.client.streamable_http import streamable_http_client as connect_mcp
    except ImportError:  # mcp 1.x
        from mcp.client.streamable_http import streamablehttp_client as connect_mcp  # type: ignore[attr-defined,no-redef]

    service = await start_service("local", expose_services=True)
    async with service.client() as http:
        sandbox_id = (await http.post("/sandboxes", json={"image": None, "block_network": True})).json()["sandbox_id"]
        assert (await http.get(f"/sandboxes/{sandbox_id}/wait")).json()["ready"]
        start = f"cat > mcp_app.py <<'EOF'\n{MCP_APP}\nEOF\nnohup {sys.executable} mcp_app.py 8765 >mcp.log 2>&1 &"
        assert (await http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": start, "wait": True})).json()[
            "exit_code"
        ] == 0
        body: dict[str, Any] = {"port": 8765, "wait_ready": True, "health_path": "/mcp", "ready_timeout": 120}
        url = (await http.post(f"/sandboxes/{sandbox_id}/services", json=body)).json()["url"]
    async with connect_mcp(url + "/mcp") as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            assert [tool.name for tool in (await session.list_tools()).tools] == ["add"]
            result = await session.call_tool("add", {"a": 2, "b": 40})
            assert "42" in str(result.content[0])
