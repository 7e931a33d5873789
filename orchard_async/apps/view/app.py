"""The view's web app (aiohttp): the page and its assets, and a small JSON API over the
indexed runs.

    GET /                          the page (static/index.html; assets under /static/)
    GET /api/runs                  the runs: path, episodes, warnings
    GET /api/summary?run=N         inspect --json's numbers, histograms, time share, facets
                                   (``pending`` until pass@k is computed; ``&complete=1`` waits for it)
    GET /api/episodes?run=N&...    a filtered, sorted page of the episodes table (query.Filters)
    GET /api/episode?run=N&row=I   one episode in full
    GET /api/group?run=N&group=G   a group's samples side by side, with advantages
    GET /api/compare               per task, every run's reward and time
    GET /api/screenshot?run=N&sha256=H   a GUI screenshot kept by hash in the run's folder
                                   (or in the folder given with ``view --screenshots DIR``)
    GET /api/file?run=N&path=P     an image the run references, by a path inside the run's folder

Trajectories are untrusted text (a model wrote them): the page puts them in the document as
text, never as markup, and the Content-Security-Policy allows only this server's own
scripts. Files are served from the run's folder (and screenshots from --screenshots DIR)
only, after resolving symlinks, and only images. The Host header must name the loopback, so a web page elsewhere cannot reach this
server through a rebinding DNS name.
"""

from __future__ import annotations

import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec
from aiohttp import web

from orchard_async.apps.view.index import RunIndex
from orchard_async.apps.view.query import (
    Filters,
    compare_runs,
    episode_detail,
    episodes_page,
    group_view,
    summary_of,
)
from orchard_async.errors import ConfigError

STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
# Where a run keeps GUI screenshots by hash, relative to its folder (the gui recipe's screenshot_dir option, or ORCHARD_GUI_SCREENSHOTS=DIR).
SCREENSHOT_DIRS = (".", "screenshots", "shots")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_SHA256 = re.compile(r"[0-9a-f]{64}")

RUNS: web.AppKey[list[RunIndex]] = web.AppKey("runs", list)
SHOTS: web.AppKey[Path | None] = web.AppKey("screenshots", Path)
CACHE: web.AppKey[dict[str, Any]] = web.AppKey("cache", dict)


def static_folder() -> Path:
    return Path(str(resources.files(__package__).joinpath("static")))


def file_inside(folder: Path, relative: str) -> Path | None:
    """``relative`` as a regular file inside ``folder`` (a resolved path) once every symlink
    and ``..`` is resolved, or None: an absolute path, a way out, or no such file."""
    if not relative or "\x00" in relative or Path(relative).is_absolute() or relative.startswith(("/", "\\", "~")):
        return None
    try:
        resolved = (folder / relative).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    if not resolved.is_relative_to(folder) or not resolved.is_file():
        return None
    return resolved


def screenshot_file(index: RunIndex, digest: str, given: Path | None = None) -> Path | None:
    """A screenshot by its hash: in ``given`` (a resolved folder) first, then beside the run."""
    if not _SHA256.fullmatch(digest):
        return None
    if given is not None and (found := file_inside(given, f"{digest}.png")) is not None:
        return found
    for folder in SCREENSHOT_DIRS:
        found = file_inside(index.folder, f"{folder}/{digest}.png")
        if found is not None:
            return found
    return None


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json")


def _run_of(request: web.Request) -> RunIndex:
    runs = request.app[RUNS]
    text = request.query.get("run", "0")
    if not text.isdigit() or int(text) >= len(runs):
        raise ConfigError(f"run must be one of 0..{len(runs) - 1}, got {text!r}")
    return runs[int(text)]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Loopback Host names only; user errors as 400 with the reason; our headers on everything."""
    host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
    if host not in LOOPBACK_HOSTS:
        return _json({"error": f"this server answers only to the loopback, not to Host {request.host!r}"}, 403)
    try:
        response = await handler(request)
    except ConfigError as exc:
        response = _json({"error": str(exc)}, 400)
    except KeyError as exc:
        response = _json({"error": f"not found: {exc.args[0] if exc.args else ''}"}, 404)
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


async def page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(static_folder() / "index.html", headers={"Content-Type": "text/html; charset=utf-8"})


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    kind = STATIC_TYPES.get(Path(name).suffix)
    found = file_inside(static_folder().resolve(), name) if kind else None
    if found is None:
        raise web.HTTPNotFound()
    return web.FileResponse(found, headers={"Content-Type": f"{kind}; charset=utf-8"})


async def runs(request: web.Request) -> web.Response:
    return _json(
        [
            {
                "run": n,
                "path": str(index.path),
                "name": index.path.name,
                "episodes": len(index),
                "warnings": index.warnings,
            }
            for n, index in enumerate(request.app[RUNS])
        ]
    )


async def summary(request: web.Request) -> web.Response:
    index = _run_of(request)
    if request.query.get("complete") in ("1", "true", "yes"):
        await anyio.to_thread.run_sync(index.complete_summary)
    cache = request.app[CACHE]
    key = f"summary:{id(index)}:{index.summary_complete}"
    if key not in cache:
        cache[key] = msgspec.json.encode(summary_of(index))
    return web.Response(body=cache[key], content_type="application/json")


async def complete_summaries(app: web.Application) -> AsyncIterator[None]:
    """pass@k of every run, computed once the server is up, so the page opens with the other
    numbers and fills these in when they are ready. A daemon thread: stopping the server
    never waits for it."""

    def complete() -> None:
        for index in app[RUNS]:
            index.complete_summary()

    threading.Thread(target=complete, name="view-pass-at-k", daemon=True).start()
    yield


async def episodes(request: web.Request) -> web.Response:
    return _json(episodes_page(_run_of(request), Filters.parse(request.query)))


async def episode(request: web.Request) -> web.Response:
    index = _run_of(request)
    text = request.query.get("row", "")
    if not text.isdigit():
        raise ConfigError(f"row must be a whole number, got {text!r}")
    shots = request.app[SHOTS]
    return _json(episode_detail(index, int(text), lambda digest: screenshot_file(index, digest, shots)))


async def group(request: web.Request) -> web.Response:
    return _json(group_view(_run_of(request), request.query.get("group", "")))


async def compare(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    if "compare" not in cache:
        cache["compare"] = msgspec.json.encode(compare_runs(request.app[RUNS]))
    return web.Response(body=cache["compare"], content_type="application/json")


def _image(path: Path | None) -> web.StreamResponse:
    kind = IMAGE_TYPES.get(path.suffix.lower()) if path is not None else None
    if path is None or kind is None:
        raise KeyError("no such image in the run's folder")
    return web.FileResponse(path, headers={"Content-Type": kind})


async def screenshot(request: web.Request) -> web.StreamResponse:
    index = _run_of(request)
    return _image(screenshot_file(index, request.query.get("sha256", ""), request.app[SHOTS]))


async def file(request: web.Request) -> web.StreamResponse:
    index = _run_of(request)
    return _image(file_inside(index.folder, request.query.get("path", "")))


def screenshot_folder(given: str) -> Path:
    """``--screenshots DIR``, resolved; a ConfigError when it is not a directory."""
    folder = Path(given).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"--screenshots {given}: not a directory (the folder that holds the run's screenshots)")
    return folder.resolve()


def create_app(indexes: list[RunIndex], screenshots: Path | None = None) -> web.Application:
    """The app over ``indexes``; ``screenshots``: a resolved folder of GUI screenshots by hash
    (``screenshot_folder``), looked in before the runs' own folders."""
    app = web.Application(middlewares=[guard])
    app[RUNS] = indexes
    app[SHOTS] = screenshots
    app[CACHE] = {}
    app.cleanup_ctx.append(complete_summaries)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/summary", summary)
    app.router.add_get("/api/episodes", episodes)
    app.router.add_get("/api/episode", episode)
    app.router.add_get("/api/group", group)
    app.router.add_get("/api/compare", compare)
    app.router.add_get("/api/screenshot", screenshot)
    app.router.add_get("/api/file", file)
    return app
