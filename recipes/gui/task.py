"""GUI tasks: a web app of the site pack and a headless Chromium in the sandbox, an intent
for the agent, and checks read from the app after the agent is done.

A task file is JSON Lines, one task a line (``tasks/builtin.jsonl`` is the bundled set)::

    {"id": "shop-cart-1", "site": "shop", "seed": 0, "start_url": "http://127.0.0.1:7101/",
     "intent": "...", "difficulty": "easy", "max_steps": 16,
     "eval": [{"type": "state_match", "site": "shop", "path": "cart.*.product_id", "equals": 17}],
     "solution": [{"action": "click", "target": {"role": "link", "name": "Cart"}}, ...]}

``solution`` is the oracle's script (targets named by role and name, resolved against the
page's tree at each step). Setup starts the sites and the browser once per sandbox
(``inside/start.py``) and opens the start URL; every step is one action through the
driver; scoring asks the driver and the sites for what they hold, signed with a key that
only they and this process know, so nothing the agent ran in the sandbox can forge it.

A browser that crashed, a site that did not come up, or a grader reply that is missing is
an infrastructure failure (retried, never a reward); a reply whose signature does not hold
is tampering, scored 0.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import io
import json
import re
import secrets
import tarfile
import urllib.parse
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from orchard_async import (
    ConfigError,
    CreateFailed,
    RecipeOptions,
    Reward,
    Sandbox,
    SandboxLost,
    SandboxSpec,
    VerifierError,
    episode_label,
    recipe_option,
)
from orchard_async.images import ImageSpec
from orchard_async.models.client import judge_config
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.checks import Final, score, validate_check
from orchard_async.recipes.gui.judge import SCREENSHOTS as JUDGE_SCREENSHOTS
from orchard_async.recipes.gui.judge import Judge

# The ports the tasks are written for, on the sandbox's loopback (inside/start.py). A sandbox
# that shares its network with others may get other ports (see _Live.ports).
SITES = {"shop": 7101, "booking": 7102, "forum": 7103}
PORTS_LINE = re.compile(r"^ports: (\{.*\})$", re.MULTILINE)
INSIDE = ".gui"  # where the driver and the sites live in the sandbox (relative to its work dir)
PAGE_MARKER = "The browser shows:"
# The browser image for container adapters: Debian's chromium, fonts, python3 (the site pack
# is copied in at setup). The local adapter uses the host's chromium.
IMAGE = ImageSpec(
    tag="orchard/gui-chromium:bookworm",
    base="debian-minbase",
    apt_packages=("chromium", "python3", "fonts-dejavu-core"),
)
SANDBOX_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
CHROMIUM_ENV = "ORCHARD_CHROMIUM"  # the driver's (inside/browserd.py) chromium, when the recipe names one
DEFAULT_SCREENSHOTS = 3


class GuiOptions(RecipeOptions):
    """The GUI recipe's options (``--recipe-options``, or keywords of ``load_tasks`` and ``make_policy``)."""

    RECIPE: ClassVar[str] = "gui"
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"screenshot_dir", "chromium"})

    screenshot_dir: Annotated[
        str | None,
        recipe_option(
            "keep every episode's screenshots in this folder, by hash (what export-gui and view read)",
            "ORCHARD_GUI_SCREENSHOTS",
        ),
    ] = None
    marks: Annotated[
        bool,
        recipe_option(
            "set-of-marks observations: numbered boxes on the screenshot, listed with the tree "
            "(the openai policy's prompt says how to read them)",
            "ORCHARD_GUI_MARKS",
        ),
    ] = False
    addressing: Annotated[
        Literal["element", "coordinates"],
        recipe_option(
            "how the openai policy's model points at the page: element ids from the accessibility tree, or coordinates",
            "ORCHARD_GUI_ADDRESSING",
        ),
    ] = "element"
    last_screenshots: Annotated[
        int,
        recipe_option(
            "how many of the latest screenshots the openai policy's model sees (0: text only)",
            "ORCHARD_GUI_LAST_SCREENSHOTS",
            ge=0,
        ),
    ] = DEFAULT_SCREENSHOTS
    chromium: Annotated[
        str | None,
        recipe_option(
            "the chromium the browser driver starts in a sandbox (default: Debian's, found on the PATH)",
            CHROMIUM_ENV,
        ),
    ] = None


class TaskLine(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    site: str
    start_url: str
    intent: str
    eval: list[dict[str, Any]]
    seed: int = 0
    difficulty: str = "medium"
    max_steps: int = 16
    solution: list[dict[str, Any]] = []
    network: str = "none"  # "on": a live site, judged by an LLM (not bundled)


def sandbox_spec(chromium: str | None = None) -> SandboxSpec:
    """The sandbox of a GUI task; ``chromium`` (the option) reaches the driver as its variable."""
    env = {**SANDBOX_ENV, CHROMIUM_ENV: chromium} if chromium else SANDBOX_ENV
    return SandboxSpec(image=IMAGE.tag, env=env, labels={"orchard.recipe": "gui"})


def inside_files() -> dict[str, bytes]:
    """The driver and the sites, as files to copy into the sandbox (relative paths)."""
    root = resources.files(__package__).joinpath("inside")
    files: dict[str, bytes] = {}

    def walk(node: Any, prefix: str) -> None:
        for entry in node.iterdir():
            if entry.name.startswith((".", "__pycache__")):
                continue
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(".py") or entry.name == "act":
                files[prefix + entry.name] = entry.read_bytes()

    walk(root, "")
    return files


@functools.cache
def inside_archive() -> bytes:
    """``inside_files`` as one tar (one command to copy them all into a sandbox)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, data in sorted(inside_files().items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755 if path == "act" else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class _Live:
    """What one episode of a task holds: its sandbox, the key its daemons got, and the ports
    its sites listen on (those of SITES, unless the sandbox shares its network with another
    that holds them: the local adapter's sandboxes with the network on)."""

    sandbox: Sandbox
    key: bytes
    ports: dict[str, int]
    page: str = ""

    def url_in_sandbox(self, url: str) -> str:
        """A URL on a site's usual port, moved to the port the site has in this sandbox."""
        return _move_port(url, {SITES[site]: port for site, port in self.ports.items()})

    def url_as_written(self, url: str) -> str:
        """A URL of this sandbox's sites, on the port the tasks are written for (for checks)."""
        return _move_port(url, {port: SITES[site] for site, port in self.ports.items()})


def _move_port(url: str, moves: dict[int, int]) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # not a URL urllib reads, or no number for a port: none of our sites
        return url
    if parts.hostname not in ("127.0.0.1", "localhost") or port not in moves or moves[port] == port:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.hostname}:{moves[port]}"))


@dataclass
class GuiTask:
    line: TaskLine
    width: int = 1280
    height: int = 720
    screenshot_dir: Path | None = None  # where episode screenshots are kept by hash (None: not kept)
    spec: SandboxSpec = field(default_factory=sandbox_spec)
    judge: Any = None  # a judge.Judge, for tasks with an llm_judge check
    deadline: float = 240.0
    score_timeout: float = 30.0
    exec_timeout: float = 30.0
    parse_failure_limit: int = 3  # replies in a row that are not actions end the episode (parse_failures)
    marks: bool = False  # set-of-marks observations (inside/marks.py): numbered boxes, listed with their boxes
    _live: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary, repr=False)
    _by_episode: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary, repr=False)

    def __post_init__(self) -> None:
        if self.line.network == "on":
            self.spec = msgspec.structs.replace(self.spec, network="on")
            self.score_timeout = max(self.score_timeout, 120.0)  # a judge model answers in its own time

    @property
    def id(self) -> str:
        return self.line.id

    @property
    def max_steps(self) -> int:
        return self.line.max_steps

    @property
    def solution(self) -> list[dict[str, Any]]:
        return self.line.solution

    async def setup(self, sandbox: Sandbox) -> str:
        unpacked = await sandbox.exec(f"mkdir -p {INSIDE} && tar -xf - -C {INSIDE}", stdin=inside_archive(), timeout=60)
        if not unpacked.ok:
            raise CreateFailed(f"could not unpack the driver and the sites: {unpacked.error_text[-500:]}")
        key = secrets.token_bytes(32)
        start = (
            f"python3 {INSIDE}/start.py --width {self.width} --height {self.height} --seed {self.line.seed}"
            f" --sites {','.join(SITES)}"
            + (" --any-host" if self.line.network == "on" else "")
            + (" --marks" if self.marks else "")
        )
        result = await sandbox.exec(start, stdin=key.hex().encode() + b"\n", timeout=60)
        if not result.ok:
            text = (result.text + result.error_text).strip()
            if "no chromium found" in text:
                raise ConfigError(
                    "the gui recipe needs Chromium in the sandbox: install Debian's chromium package "
                    "(local adapter) or build the browser image (`orchard-async images build`)"
                )
            raise CreateFailed(f"the browser or the sites did not come up: {text[-1500:]}")
        ports = PORTS_LINE.search(result.text)
        if ports is None:
            raise CreateFailed(f"the sites came up without saying their ports: {result.text[-500:]!r}")
        live = _Live(sandbox, key, json.loads(ports.group(1)))
        sandbox._orchard_gui = live  # type: ignore[attr-defined]  # lives as long as the sandbox object
        self._live[sandbox.id] = live
        label = sandbox.labels.get("orchard.episode")
        if label:
            self._by_episode[label] = live
        page = await self._run(sandbox, {"action": "goto", "url": live.url_in_sandbox(self.line.start_url)})
        if page.startswith("error") or page.startswith("feedback: error"):
            raise CreateFailed(f"the start page {self.line.start_url} did not open: {page[:500]}")
        live.page = page
        return f"{self.line.intent}\n\n{PAGE_MARKER}\n{page}"

    async def _run(self, sandbox: Sandbox, action: dict[str, Any]) -> str:
        result = await sandbox.exec(actions.command(action), timeout=self.exec_timeout)
        if not result.ok:
            logs = await sandbox.exec(
                f"tail -c 1500 {INSIDE}/run/browserd.log; tail -c 600 {INSIDE}/run/chromium.log", timeout=10
            )
            raise SandboxLost(
                f"the browser driver failed ({result.reason.value}, exit {result.exit_code}): "
                f"{(result.text + result.error_text)[-300:]} logs: {logs.text[-2100:]}"
            )
        return result.text

    async def screenshot(self, episode_id: str, digest: str) -> bytes | None:
        """A screenshot of a live episode by its hash (what a model policy shows its model)."""
        live = self._by_episode.get(episode_label(episode_id))
        if live is None or not re.fullmatch(r"[0-9a-f]{64}", digest):
            return None
        try:
            return await live.sandbox.read_file(f"{INSIDE}/run/shots/{digest}.png")
        except FileNotFoundError:
            return None

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        live = self._live.pop(sandbox.id, None)
        if live is None:
            raise VerifierError("no browser was set up in this sandbox")
        nonce = secrets.token_hex(16)
        js_checks = [check for check in self.line.eval if check["type"] == "program_html"]
        state_sites = {
            check.get("site", "shop") for check in self.line.eval if check["type"] in ("state_match", "purchase")
        }
        request = {
            "op": "grade",
            "nonce": nonce,
            "js": [check["js"] for check in js_checks],
            "state": {
                site: {"port": live.ports[site], "sig": _request_signature(live.key, "state", nonce)}
                for site in state_sites
            },
        }
        result = await sandbox.exec(actions.command(request), timeout=self.score_timeout / 2)
        await self._keep_screenshots(sandbox)
        try:
            reply = json.loads(result.stdout)
            body = reply["body"].encode()
            states = reply.get("states", {})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise VerifierError(
                f"the browser driver gave no verdict: {(result.text + result.error_text)[:300]!r}"
            ) from None
        tampered = []
        if not _signed(live.key, nonce, body, reply.get("signature")):
            tampered.append("driver")
        final_state: dict[str, Any] = {}
        for site in state_sites:
            got = states.get(site) or {}
            if "error" in got:
                raise VerifierError(f"the {site} site did not answer the grader: {got['error']}")
            if not _signed(live.key, nonce, str(got.get("body", "")).encode(), got.get("signature")):
                tampered.append(site)
                continue
            final_state[site] = json.loads(got["body"])
        if tampered:
            return Reward(value=0.0, success=False, info={"tampered": tampered, "checks": []})
        driver = json.loads(body)
        if driver.get("crashed"):
            raise SandboxLost(f"the browser crashed during the episode: {driver['crashed']}")
        final = Final(
            answer=driver.get("answer"),
            url=live.url_as_written(driver.get("url", "")),
            js=driver.get("js", []),
            states=final_state,
        )
        js_index = {id(check): index for index, check in enumerate(js_checks)}
        value, results = 1.0, []
        for check in self.line.eval:
            if check["type"] == "llm_judge":
                part, seen = await self._judge(sandbox, final, driver.get("shots", []))
            else:
                part, seen = score(check, final, js_index)
            value *= part
            results.append({"type": check["type"], "score": part, "seen": seen})
        info = {
            "checks": results,
            "answer": final.answer,
            "url": final.url,
            "action_errors": driver.get("errors", 0),
            "actions": driver.get("actions", 0),
        }
        return Reward(value=value, success=value == 1.0, info=info)

    async def _judge(self, sandbox: Sandbox, final: Final, shots: list[str]) -> tuple[float, str]:
        if self.judge is None:
            raise VerifierError("this task has an llm_judge check but no judge: set ORCHARD_JUDGE_MODEL")
        images = []
        for digest in shots[-JUDGE_SCREENSHOTS:]:
            if re.fullmatch(r"[0-9a-f]{64}", str(digest)):
                images.append(await sandbox.read_file(f"{INSIDE}/run/shots/{digest}.png"))
        return await self.judge(self.line.intent, final.answer, images)

    async def _keep_screenshots(self, sandbox: Sandbox) -> None:
        """Copy the episode's screenshots to screenshot_dir, named by content hash (the steps
        name them by that hash; one image shared by many steps is stored once)."""
        if self.screenshot_dir is None:
            return
        self.screenshot_dir.mkdir(parents=True, exist_ok=True)
        try:
            entries = await sandbox.list_dir(f"{INSIDE}/run/shots")
        except FileNotFoundError:
            return
        for entry in entries:
            name = getattr(entry, "name", "")
            if re.fullmatch(r"[0-9a-f]{64}\.png", name) and not (self.screenshot_dir / name).exists():
                data = await sandbox.read_file(f"{INSIDE}/run/shots/{name}")
                if hashlib.sha256(data).hexdigest() == name[:-4]:
                    (self.screenshot_dir / name).write_bytes(data)


def _request_signature(key: bytes, what: str, nonce: str) -> str:
    return hmac.new(key, f"request\n{what}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def _signed(key: bytes, nonce: str, body: bytes, signature: Any) -> bool:
    expected = hmac.new(key, nonce.encode() + b"\n" + body, hashlib.sha256).hexdigest()
    return isinstance(signature, str) and hmac.compare_digest(expected, signature)


def parse_task_line(text: str, where: str) -> TaskLine:
    try:
        line = msgspec.json.decode(text, type=TaskLine)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{where}: not a valid GUI task ({exc})") from None
    if line.site not in SITES and line.network != "on":
        raise ConfigError(f"{where}: unknown site {line.site!r}; bundled sites: {', '.join(SITES)}")
    if line.max_steps < 1:
        raise ConfigError(f"{where}: max_steps must be at least 1")
    if not line.eval:
        raise ConfigError(f"{where}: a task needs at least one eval check")
    for index, check in enumerate(line.eval):
        validate_check(check, f"{where} eval[{index}]")
    return line


def read_task_file(path: Path) -> list[TaskLine]:
    lines = []
    seen: set[str] = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip() or text.lstrip().startswith("//"):
            continue
        line = parse_task_line(text, f"{path.name}:{number}")
        if line.id in seen:
            raise ConfigError(f"{path.name}:{number}: task id {line.id!r} appears twice")
        seen.add(line.id)
        lines.append(line)
    return lines


def builtin_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("tasks", "builtin.jsonl")))


def load_tasks(
    source: str = "builtin", options: GuiOptions | Mapping[str, Any] | None = None, **keywords: Any
) -> list[GuiTask]:
    """``builtin``, ``builtin:ID,ID`` (a subset by id or site), a .jsonl file of tasks, or
    live-site tasks: ``webvoyager:FILE`` / ``mind2web:FILE`` (see ``live``; judged by a model).
    ``options`` (``GuiOptions``, a mapping or keywords): ``screenshot_dir`` keeps every
    episode's screenshots there by hash; ``marks`` gives set-of-marks observations;
    ``chromium`` names the browser the driver starts."""
    from orchard_async.recipes.gui import live  # it builds TaskLines: imported here, not at the top (a cycle)

    opts = GuiOptions.resolve(options, **keywords)
    kind, _, rest = source.partition(":")
    if kind in live.FORMATS:
        lines = live.read_live_tasks(kind, Path(rest))
    elif source == "builtin" or source.startswith("builtin:"):
        lines = read_task_file(builtin_path())
        if ":" in source:
            wanted = {part for part in source.split(":", 1)[1].split(",") if part}
            lines = [line for line in lines if line.id in wanted or line.site in wanted]
            if not lines:
                raise ConfigError(f"no bundled GUI task matches {source!r}")
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"--tasks {source!r}: not 'builtin' and not a file of GUI tasks (.jsonl)")
        lines = read_task_file(path)
    judged = any(check["type"] == "llm_judge" for line in lines for check in line.eval)
    judge = Judge(judge_config()) if judged else None  # ConfigError now, not at the first score
    shots = Path(opts.screenshot_dir) if opts.screenshot_dir else None
    spec = sandbox_spec(opts.chromium)
    return [GuiTask(line, screenshot_dir=shots, judge=judge, marks=opts.marks, spec=spec) for line in lines]
