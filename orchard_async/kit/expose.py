"""A sandbox's ports as URLs on the controller's loopback: ``sandbox.expose(port)``.

``expose(port)`` opens a listener on a free port of the controller's ``127.0.0.1`` and
answers ``http://127.0.0.1:N``; every connection accepted there is relayed, byte for byte,
to ``127.0.0.1:port`` inside the sandbox through a new ``connect`` (``kit.streams``: a relay
process in the sandbox over ``open_stream``). So HTTP, WebSocket or any other TCP protocol
reaches a server in the sandbox whatever its network spec says, ``none`` included, and on
every adapter that can open streams.

Unlike ``forward`` (a block), an exposure lives as long as the sandbox: ``unexpose(port)``
ends one, and closing the sandbox ends all of them first, their open connections with
them. Any local user of the controller's machine can connect to the listener while it is
open: it is for clients in this process (an OpenEnv ``EnvClient``, an MCP client, a
browser driver), not a way to publish a sandbox; the service's ``/s/{token}`` proxy
(``orchard-async serve --services``) is that, with a token checked on every request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from orchard_async.errors import ConfigError, SandboxLost
from orchard_async.kit import streams
from orchard_async.kit.background import Background

if TYPE_CHECKING:
    from orchard_async.protocols import Sandbox


def check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"port must be an integer from 1 to 65535, got {port!r}")
    return port


class _Exposure:
    def __init__(self, url: str, listener: anyio.abc.Listener[anyio.abc.SocketStream]):
        self.url = url
        self.listener = listener
        self.scope: anyio.CancelScope | None = None
        self.ended = anyio.Event()


class Exposures:
    """One sandbox's exposed ports (what ``ShellSandbox`` and ``RemoteSandbox`` delegate to).

    Each listener is served by a task of its own ``Background`` group, so exposing needs no
    task group from the caller and outlives the call that made it."""

    def __init__(self, sandbox: Sandbox):
        self._sandbox = sandbox
        self._open: dict[int, _Exposure] = {}
        self._background = Background()
        self._closed = False

    @property
    def ports(self) -> list[int]:
        return sorted(self._open)

    async def expose(self, port: int) -> str:
        check_port(port)
        if self._closed or getattr(self._sandbox, "closed", False):
            raise SandboxLost(f"sandbox {self._sandbox.id} is closed: nothing to expose")
        if port in self._open:
            return self._open[port].url
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        exposure = _Exposure(f"http://127.0.0.1:{listener.extra(SocketAttribute.local_port)}", listener)
        self._open[port] = exposure
        exposure.scope = self._background.start_soon(self._serve, exposure, port)
        return exposure.url

    async def _serve(self, exposure: _Exposure, port: int) -> None:
        try:
            async with exposure.listener:
                await exposure.listener.serve(lambda client: streams.splice(client, self._sandbox, port))
        finally:
            exposure.ended.set()

    async def unexpose(self, port: int) -> bool:
        """End one exposure: its listener and its open connections. False if ``port`` was
        not exposed."""
        exposure = self._open.pop(port, None)
        if exposure is None:
            return False
        with anyio.CancelScope(shield=True):
            if exposure.scope is not None:
                exposure.scope.cancel()
            await exposure.ended.wait()
        return True

    async def close(self) -> None:
        """End every exposure (the sandbox is closing); later ``expose`` calls refuse."""
        self._closed = True
        self._open.clear()
        await self._background.close()
