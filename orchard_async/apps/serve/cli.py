"""``orchard-async serve``: the environment service, speaking Orchard Env's HTTP API.

Registered in the ``orchard_async.commands`` entry-point group (value
``orchard_async.apps.serve.cli:add_serve_command``), so the core CLI imports aiohttp only when
this command runs.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import signal
import socket
import sys

import anyio
from aiohttp import web

import orchard_async as oa
from orchard_async.apps.serve.adopt import can_adopt
from orchard_async.apps.serve.app import create_app
from orchard_async.apps.serve.keys import KeyStore, load_keys, new_key
from orchard_async.errors import ConfigError

REATTACH_GRACE = 120.0  # a crashed service's restart (a pod rescheduled, an image pulled) fits in it
SERVE_HELP = "run the environment service (Orchard Env's HTTP API) over an adapter"


def add_serve_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``serve`` subcommand."""
    parser.description = SERVE_HELP
    parser.add_argument("--adapter", default="local", help="the adapter behind the service (default local)")
    parser.add_argument("--adapter-options", help="JSON object of adapter options")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--keys", help="JSON file of API key hashes and quotas (without it: loopback only, no keys)")
    parser.add_argument("--new-key", metavar="NAME", help="print a new API key and its --keys entry, then exit")
    parser.add_argument("--max-sandboxes", type=int, default=1000, help="live sandboxes in all (default 1000)")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MiB (default 64)")
    parser.add_argument("--default-ttl", type=float, default=3600.0, help="lifetime when a create names none (s)")
    parser.add_argument("--idle-timeout", type=float, default=1800.0, help="idle seconds before removal (0: never)")
    parser.add_argument(
        "--name",
        help="this service's name on its sandboxes: a restart with the same name re-adopts them "
        "(default serve-<host>-<port>)",
    )
    parser.add_argument(
        "--reattach-grace",
        type=float,
        default=REATTACH_GRACE,
        help=f"seconds a sandbox outlives a crashed service, for the restart to re-adopt it (default {REATTACH_GRACE:g}; "
        "0: none; adapters with attach only: docker, kubernetes)",
    )
    parser.add_argument(
        "--services",
        action="store_true",
        help="allow exposing a port of a sandbox: POST /sandboxes/{id}/services gives a URL with a token, "
        "/s/{token}/ proxies HTTP and WebSocket into the port (off by default)",
    )
    parser.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    if args.new_key:
        key, entry = new_key(args.new_key)
        print(key)
        print(f'add to the --keys file\'s "keys" list: {entry}', file=sys.stderr)
        return 0
    keys = KeyStore(load_keys(args.keys)) if args.keys else KeyStore()
    if not keys.required and not is_loopback(args.host):
        raise ConfigError(
            f"without --keys the service listens on loopback only; pass --keys FILE to serve on {args.host}"
        )
    for name, value in (("--max-sandboxes", args.max_sandboxes), ("--max-body-mb", args.max_body_mb)):
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")
    if args.idle_timeout < 0 or args.default_ttl <= 0:
        raise ConfigError("--idle-timeout must be 0 or more and --default-ttl positive")
    if not 0 <= args.reattach_grace <= 86400:
        raise ConfigError(f"--reattach-grace must be between 0 and 86400 seconds, got {args.reattach_grace}")
    listener = bind(args.host, args.port)
    try:
        from orchard_async.apps.cli import make_adapter, parse_adapter_options  # the core CLI's, for the same errors

        options = parse_adapter_options(args.adapter_options)
        adapter = make_adapter(args.adapter, options)
        if args.reattach_grace and can_adopt(adapter) and "reattach_grace" not in options:
            # its sandboxes outlive a crash of the service, for the restart to re-adopt them
            adapter = make_adapter(args.adapter, {**options, "reattach_grace": args.reattach_grace})
    except BaseException:
        listener.close()
        raise
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    app = create_app(
        adapter,
        keys=keys,
        max_body=int(args.max_body_mb * (1 << 20)),
        max_sandboxes=args.max_sandboxes,
        default_ttl=args.default_ttl,
        idle_timeout=args.idle_timeout,
        service_name=args.name or f"serve-{socket.gethostname()}-{listener.getsockname()[1]}",
        expose_services=args.services,
    )
    host, port = listener.getsockname()[:2]
    who = f"{len(keys.tenants)} API keys from {args.keys}" if keys.required else "no API keys: loopback only"
    print(f"orchard-async serve: {args.adapter} adapter on http://{host}:{port} ({who})", file=sys.stderr, flush=True)
    oa.run(_serve, app, listener)
    return 0


async def _serve(app: web.Application, listener: socket.socket) -> None:
    # No aiohttp access log: it would print query strings, where a PTY client puts its key.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.SockSite(runner, listener).start()
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                print("orchard-async serve: stopping; removing every sandbox", file=sys.stderr, flush=True)
                break
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, made before anything else: a port in use is a one-line error."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(1024)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use; stop what holds it or pick another --port") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    listener.setblocking(False)
    return listener
