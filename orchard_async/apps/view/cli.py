"""``orchard-async view RUN [RUN2] [--screenshots DIR] [--port 8765] [--no-open]``: look at a run in the browser.

Registered in the ``orchard_async.commands`` entry-point group (value
``orchard_async.apps.view.cli:add_view_command``), so the core CLI imports aiohttp only when this
command runs. Everything that can be wrong (a file that is not a trajectory file, a port in
use) is found before the page opens, and is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
import threading
import time
import webbrowser

import anyio
from aiohttp import web

from orchard_async.apps.view.app import create_app, screenshot_folder
from orchard_async.apps.view.index import RunIndex
from orchard_async.errors import ConfigError
from orchard_async.runtime import run

VIEW_HELP = "look at a run in the browser: summary, episodes, steps, diffs, screenshots, groups, two runs side by side"
HOST = "127.0.0.1"  # the page shows trajectories: loopback only, never another address


def add_view_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``view`` subcommand."""
    parser.description = VIEW_HELP
    parser.add_argument("run", help="trajectory file (.jsonl or .msgpack)")
    parser.add_argument("compare", nargs="?", help="a second trajectory file: per-task comparison with the first")
    parser.add_argument(
        "--screenshots",
        metavar="DIR",
        help="the folder of the GUI screenshots (the gui recipe's screenshot_dir option of the run; default: the run's "
        "folder, its screenshots/ or shots/)",
    )
    parser.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0: any free one)")
    parser.add_argument("--no-open", action="store_true", help="do not open a browser; print the address")
    parser.set_defaults(func=view_command)


def bind(port: int) -> socket.socket:
    """The listening socket, made before the files are read: a port in use is a one-line error."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Not a second listener (Linux refuses that anyway): just no wait after a restart.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {HOST} is in use; stop what holds it or pick another --port") from None
        raise ConfigError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None
    listener.setblocking(False)
    return listener


def open_runs(paths: list[str]) -> list[RunIndex]:
    """Index every file (ConfigError for one that is not a trajectory file); each warning
    (a torn or corrupt record, skipped) goes to stderr, and shows on the page too."""
    indexes = []
    for path in paths:
        started = time.perf_counter()
        index = RunIndex.open(path)
        for warning in index.warnings:
            print(f"warning: {index.path}: {warning}", file=sys.stderr)
        print(
            f"orchard-async view: {index.path}: {len(index)} episodes indexed in {time.perf_counter() - started:.2f} s",
            file=sys.stderr,
        )
        indexes.append(index)
    return indexes


def view_command(args: argparse.Namespace) -> int:
    screenshots = screenshot_folder(args.screenshots) if args.screenshots else None
    listener = bind(args.port)
    try:
        indexes = open_runs([args.run] + ([args.compare] if args.compare else []))
    except BaseException:
        listener.close()
        raise
    port = listener.getsockname()[1]
    url = f"http://{HOST}:{port}/"
    print(f"orchard-async view: {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    if not args.no_open:
        # A browser launcher can block until the browser exits: never on the event loop.
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    run(serve, create_app(indexes, screenshots), listener)
    return 0


async def serve(app: web.Application, listener: socket.socket) -> None:
    """Serve until SIGINT or SIGTERM."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.SockSite(runner, listener).start()
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
