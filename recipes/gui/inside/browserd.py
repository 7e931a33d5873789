"""The browser driver: one headless Chromium per sandbox, driven over CDP, kept for the episode.

Runs inside the sandbox with any python3 (stdlib only):

    python3 browserd.py --run DIR --width 1280 --height 720 < key

It starts Chromium with ``--remote-debugging-pipe`` (CDP on fds 3 and 4: no port that other
processes of the sandbox could connect to), then serves requests on a FIFO pair in DIR: one
JSON line in ``DIR/req``, the reply out of ``DIR/resp`` (``act`` is the client). A request
is an action (``{"action": "click", "element": "12"}``), ``{"op": "observe"}``, or the
grader's ``{"op": "grade", "nonce": ..., "js": [...]}``, whose reply is signed with the key.

An action's reply is the agent's next observation, as text: the action's feedback, the URL,
the open tabs, the screenshot's content hash (the PNG is written to DIR/shots/<sha256>.png)
and the page's accessibility tree, one node a line, ``[id] role "name"`` with the element id
the next action may name.
"""

# HTML and messages are %-templates: long templates read better with positional fields.
# ruff: noqa: UP031

import argparse
import base64
import errno
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
import traceback
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "sites"))

import marks  # noqa: E402
from common import make_undumpable, read_key, sign  # noqa: E402
from web import BROWSER_COOKIE, browser_token  # noqa: E402

TREE_CHARS = 12000  # the step's text stays under the episode's 16,000-character cut
NAVIGATION_START_WINDOW = 0.03  # seconds an action is given to start a navigation
SLOW_CALL = 2.0  # seconds: a command slower than this is logged
INPUT_TIMEOUT = 5.0
SCREENSHOT_TIMEOUT = 4.0  # an input event the page does not acknowledge: it navigated away meanwhile
LOAD_TIMEOUT = 10.0
SKIPPED_ROLES = {"generic", "none", "presentation"}  # shown only when they have a name
HIDDEN_ROLES = {"InlineTextBox", "ListMarker", "LineBreak"}  # never shown: their text is their parent's
SHOWN_PROPERTIES = ("focused", "checked", "selected", "expanded", "disabled", "required", "invalid", "level", "modal")
KEYS = {
    "Enter": (13, "\r"),
    "Tab": (9, ""),
    "Escape": (27, ""),
    "Backspace": (8, ""),
    "Delete": (46, ""),
    "ArrowUp": (38, ""),
    "ArrowDown": (40, ""),
    "ArrowLeft": (37, ""),
    "ArrowRight": (39, ""),
    "PageUp": (33, ""),
    "PageDown": (34, ""),
    "Home": (36, ""),
    "End": (35, ""),
    "Space": (32, " "),
}
MODIFIERS = {"Alt": 1, "Control": 2, "Meta": 4, "Shift": 8}
FILL_SCRIPT = """function(text) {
  const special = ['date', 'time', 'datetime-local', 'month', 'week', 'color', 'range'];
  if (this.tagName === 'SELECT') return 'use select_option for a select';
  if (this.tagName === 'INPUT' && special.includes(this.type)) {
    const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
    setter.call(this, text);
    this.dispatchEvent(new Event('input', {bubbles: true}));
    this.dispatchEvent(new Event('change', {bubbles: true}));
    return 'set';
  }
  if (this.tagName === 'INPUT' || this.tagName === 'TEXTAREA') { this.focus(); this.select(); return 'type'; }
  if (this.isContentEditable) { this.focus(); document.execCommand('selectAll'); return 'type'; }
  return 'the element is not a text field';
}"""
SELECT_SCRIPT = """function(choice) {
  if (this.tagName !== 'SELECT') return {error: 'the element is not a select'};
  const wanted = choice.trim().toLowerCase();
  const found = Array.from(this.options).find(o => o.label.trim().toLowerCase() === wanted || o.value.toLowerCase() === wanted);
  if (!found) return {error: 'no option ' + JSON.stringify(choice) + '; options: ' + Array.from(this.options).map(o => JSON.stringify(o.label)).join(', ')};
  this.value = found.value;
  this.dispatchEvent(new Event('input', {bubbles: true}));
  this.dispatchEvent(new Event('change', {bubbles: true}));
  return {selected: found.label};
}"""


class BrowserGone(Exception):
    """Chromium exited or its pipe broke: the episode cannot go on (an infrastructure failure)."""


class Unanswered(BrowserGone):
    """A call the browser did not answer in time."""


class ActionError(Exception):
    """The action could not be done (no such element, bad URL): feedback for the agent."""


class CDP:
    """The DevTools protocol over Chromium's pipe: NUL-terminated JSON messages."""

    def __init__(self, write_fd, read_fd):
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.results = {}

    def send(self, method, params=None, session=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self.write_fd, data) :]
        except OSError as exc:
            raise BrowserGone("cannot write to the browser: %s" % exc) from None
        return self.next_id

    def pump(self, timeout):
        """Read what the browser sent within timeout seconds; False if nothing came."""
        ready, _, _ = select.select([self.read_fd], [], [], max(0.0, timeout))
        if not ready:
            return False
        try:
            chunk = os.read(self.read_fd, 1 << 20)
        except OSError as exc:
            raise BrowserGone("cannot read from the browser: %s" % exc) from None
        if not chunk:
            raise BrowserGone("the browser exited")
        self.buffer += chunk
        *messages, self.buffer = self.buffer.split(b"\0")
        for raw in messages:
            message = json.loads(raw)
            if "id" in message:
                self.results[message["id"]] = message
            else:
                self.events.append(message)
        return True

    def call(self, method, params=None, session=None, timeout=30.0):
        """One command's result. While a page swaps documents, its session briefly answers
        "not attached to an active page": commands other than input events are retried then
        (an input event may have been delivered: the caller decides, see Browser._input)."""
        for attempt in range(20):
            try:
                return self._call_once(method, params, session, timeout)
            except ActionError as exc:
                if method.startswith("Input.") or "not attached" not in str(exc).lower() or attempt == 19:
                    raise
                self.pump(0.05)
        raise AssertionError("unreachable")

    def _call_once(self, method, params, session, timeout):
        number = self.send(method, params, session)
        started = time.monotonic()
        deadline = started + timeout
        while number not in self.results:
            if time.monotonic() > deadline:
                print("unanswered: %s %s after %.0fs" % (method, json.dumps(params)[:200], timeout), flush=True)
                raise Unanswered("the browser did not answer %s within %.0fs" % (method, timeout))
            self.pump(deadline - time.monotonic())
        message = self.results.pop(number)
        if time.monotonic() - started > SLOW_CALL:
            print("slow: %s took %.1fs" % (method, time.monotonic() - started), flush=True)
        if "error" in message:
            raise ActionError(message["error"].get("message", "error"))
        return message.get("result", {})

    def take_events(self):
        events, self.events = self.events, []
        return events


def find_chromium():
    for candidate in (
        os.environ.get("ORCHARD_CHROMIUM"),
        "/usr/lib/chromium/chromium",
        "chromium",
        "chromium-browser",
        "google-chrome",
    ):
        if candidate and (os.path.isabs(candidate) and os.access(candidate, os.X_OK) or shutil.which(candidate)):
            return candidate if os.path.isabs(candidate) else shutil.which(candidate)
    raise SystemExit("no chromium found (install Debian's chromium package)")


class Browser:
    def __init__(self, run_dir, width, height, key, allowed_hosts, with_marks=False):
        self.run_dir, self.width, self.height, self.key = run_dir, width, height, key
        self.with_marks = with_marks  # set-of-marks: boxes drawn into the screenshot, listed in the observation
        self.allowed_hosts = allowed_hosts  # None: any host (live mode)
        self.shots = os.path.join(run_dir, "shots")
        os.makedirs(self.shots, exist_ok=True)
        to_browser, from_driver = os.pipe()
        to_driver, from_browser = os.pipe()

        def child_fds():
            read_end, write_end = os.dup(to_browser), os.dup(from_browser)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        home = os.path.join(run_dir, "home")
        os.makedirs(home, exist_ok=True)
        argv = [
            find_chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--user-data-dir=" + os.path.join(run_dir, "profile"),
            "--window-size=%d,%d" % (width, height),
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--disable-component-update",
            "--disable-default-apps",
            "--mute-audio",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--disable-dev-shm-usage",
            "--password-store=basic",
            "--use-mock-keychain",
            # No renderer swaps on same-site navigations (back-forward cache, proactive
            # BrowsingInstance swaps): fewer processes, and input events always acknowledged.
            "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication,"
            "BackForwardCache,ProactivelySwapBrowsingInstance",
            "--disable-site-isolation-trials",
            "--font-render-hinting=none",
            "about:blank",
        ]
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=home, XDG_CACHE_HOME=home)
        log = open(os.path.join(run_dir, "chromium.log"), "ab")
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, pass_fds=(3, 4), preexec_fn=child_fds
        )
        os.close(to_browser)
        os.close(from_browser)
        self.cdp = CDP(from_driver, to_driver)
        self.tabs = []  # [{"target": id, "session": id, "frame": main frame id}]
        self.current = 0
        self.answer = None
        self.last_shot = ""
        self.actions = 0
        self.errors = 0
        self.crashed = ""
        self.input_navigated = False
        self.shot_history = []  # hashes of the latest distinct screenshots, oldest first (for a judge)
        self.cdp.call("Target.setDiscoverTargets", {"discover": True})
        self.cdp.call(
            "Storage.setCookies",
            {
                "cookies": [
                    {"name": BROWSER_COOKIE, "value": browser_token(key), "domain": host, "path": "/", "httpOnly": True}
                    for host in ("127.0.0.1", "localhost")
                ]
            },
        )
        # A tab of our own: the one Chromium opens at start may still be swapped while it starts.
        initial = [t["targetId"] for t in self.cdp.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        self._attach(self.cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"])
        for target in initial:
            self.cdp.call("Target.closeTarget", {"targetId": target})

    # -- tabs ------------------------------------------------------------------------------

    def _attach(self, target):
        session = self.cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.cdp.call("Page.enable", session=session)
        self.cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        self.cdp.call("Emulation.setFocusEmulationEnabled", {"enabled": True}, session=session)
        self.cdp.call("Page.bringToFront", session=session)
        frame = self.cdp.call("Page.getFrameTree", session=session)["frameTree"]["frame"]["id"]
        self.tabs.append({"target": target, "session": session, "frame": frame})
        self.current = len(self.tabs) - 1

    @property
    def session(self):
        return self.tabs[self.current]["session"]

    def _adopt_new_tabs(self, events):
        """A page the site opened (a link with target=_blank) becomes the current tab."""
        known = {tab["target"] for tab in self.tabs}
        for event in events:
            if event.get("method") == "Target.targetCreated":
                info = event["params"]["targetInfo"]
                if info["type"] == "page" and info["targetId"] not in known and info.get("openerId"):
                    self._attach(info["targetId"])
                    return True
        return False

    # -- settling --------------------------------------------------------------------------

    def _settle(self, navigating=False):
        """Wait for a navigation the action started to load. Returns the events seen."""
        seen = []
        frame = self.tabs[self.current]["frame"]
        deadline = time.monotonic() + NAVIGATION_START_WINDOW
        loading = navigating
        while True:
            if not loading and time.monotonic() >= deadline:
                break
            if loading and time.monotonic() >= deadline + LOAD_TIMEOUT:
                break
            self.cdp.pump(0.005 if not loading else 0.05)
            for event in self.cdp.take_events():
                seen.append(event)
                method, params = event.get("method", ""), event.get("params", {})
                if event.get("sessionId") not in (None, self.session):
                    continue
                if (
                    method in ("Page.frameStartedLoading", "Page.frameRequestedNavigation")
                    and params.get("frameId") == frame
                ):
                    loading = True
                elif method == "Page.loadEventFired" or (
                    method == "Page.frameStoppedLoading" and params.get("frameId") == frame
                ):
                    if loading:
                        return seen
        return seen

    # -- element addressing ----------------------------------------------------------------

    def _node(self, element):
        try:
            node = int(str(element).strip("[] "))
        except ValueError:
            raise ActionError("element ids are numbers from the page's tree, like 12; got %r" % (element,)) from None
        return node

    def _center(self, element):
        node = self._node(element)
        try:
            self.cdp.call("DOM.scrollIntoViewIfNeeded", {"backendNodeId": node}, self.session)
            quads = self.cdp.call("DOM.getContentQuads", {"backendNodeId": node}, self.session)["quads"]
        except ActionError:
            raise ActionError("no element [%s] on this page (ids come from the latest tree)" % element) from None
        if not quads:
            raise ActionError("element [%s] is not visible" % element)
        quad = quads[0]
        return sum(quad[0::2]) / 4, sum(quad[1::2]) / 4

    def _object(self, element):
        node = self._node(element)
        try:
            return self.cdp.call("DOM.resolveNode", {"backendNodeId": node}, self.session)["object"]["objectId"]
        except (ActionError, KeyError):
            raise ActionError("no element [%s] on this page (ids come from the latest tree)" % element) from None

    def _call_on(self, element, script, argument):
        result = self.cdp.call(
            "Runtime.callFunctionOn",
            {
                "objectId": self._object(element),
                "functionDeclaration": script,
                "arguments": [{"value": argument}],
                "returnByValue": True,
                "awaitPromise": False,
            },
            self.session,
        )
        return result.get("result", {}).get("value")

    def _input(self, method, params):
        """An input event. A page that navigates while handling it may never acknowledge it
        (its renderer is swapped out): that is a navigation, not a failure."""
        try:
            self.cdp.call(method, params, self.session, timeout=INPUT_TIMEOUT)
        except ActionError as exc:
            if "not attached" not in str(exc).lower():
                raise
            self.input_navigated = True
        except Unanswered:
            self.input_navigated = True

    def _mouse(self, kind, x, y, button="left", clicks=1, **extra):
        params = {"type": kind, "x": x, "y": y, "button": button, "clickCount": clicks}
        params.update(extra)
        self._input("Input.dispatchMouseEvent", params)

    def _click_at(self, x, y):
        self._mouse("mouseMoved", x, y, button="none", clicks=0)
        self._mouse("mousePressed", x, y)
        self._mouse("mouseReleased", x, y)

    def _key(self, combo):
        parts = combo.replace(" ", "").split("+")
        name, modifiers = parts[-1], 0
        for part in parts[:-1]:
            if part not in MODIFIERS:
                raise ActionError("unknown modifier %r; use %s" % (part, ", ".join(MODIFIERS)))
            modifiers |= MODIFIERS[part]
        if name in KEYS:
            code, text = KEYS[name]
        elif len(name) == 1:
            code, text = ord(name.upper()), name
        else:
            raise ActionError("unknown key %r; use a character or one of %s" % (name, ", ".join(KEYS)))
        if modifiers & ~MODIFIERS["Shift"]:
            text = ""
        down = {
            "type": "keyDown" if text else "rawKeyDown",
            "key": name if name != "Space" else " ",
            "windowsVirtualKeyCode": code,
            "modifiers": modifiers,
        }
        if text:
            down["text"] = text
        self._input("Input.dispatchKeyEvent", down)
        self._input(
            "Input.dispatchKeyEvent",
            {"type": "keyUp", "key": down["key"], "windowsVirtualKeyCode": code, "modifiers": modifiers},
        )

    def _check_url(self, url):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ActionError("only http(s) URLs can be opened, got %r" % url)
        if self.allowed_hosts is not None and parts.hostname not in self.allowed_hosts:
            raise ActionError(
                "%s is outside this environment: only its own sites (%s) can be opened"
                % (parts.hostname, ", ".join(sorted(self.allowed_hosts)))
            )

    # -- actions ---------------------------------------------------------------------------

    def act(self, action):
        """Do one action; return its feedback (text). ActionError: feedback of a failure."""
        name = action.get("action")
        before = self._url()
        navigating = self.input_navigated = False
        if name == "click":
            if "element" in action and action["element"] not in (None, ""):
                x, y = self._center(action["element"])
                what = "[%s]" % action["element"]
            else:
                x, y = float(action["x"]), float(action["y"])
                what = "(%d, %d)" % (x, y)
            self._click_at(x, y)
            feedback = "clicked " + what
        elif name == "hover":
            x, y = self._center(action["element"])
            self._mouse("mouseMoved", x, y, button="none", clicks=0)
            feedback = "hovered over [%s]" % action["element"]
        elif name == "fill":
            text = str(action.get("text", ""))
            how = self._call_on(action["element"], FILL_SCRIPT, text)
            if how == "type":
                self._key("Delete")
                if text:
                    self.cdp.call("Input.insertText", {"text": text}, self.session)
            elif how != "set":
                raise ActionError("cannot fill [%s]: %s" % (action["element"], how))
            feedback = "filled [%s] with %s" % (action["element"], json.dumps(text))
        elif name == "select_option":
            result = self._call_on(action["element"], SELECT_SCRIPT, str(action.get("option", ""))) or {}
            if "error" in result:
                raise ActionError("cannot select in [%s]: %s" % (action["element"], result["error"]))
            feedback = "selected %s in [%s]" % (json.dumps(result["selected"]), action["element"])
        elif name == "write":
            self.cdp.call("Input.insertText", {"text": str(action.get("text", ""))}, self.session)
            feedback = "typed %s" % json.dumps(action.get("text", ""))
        elif name in ("press", "press_keys"):
            keys = action.get("keys") or [action.get("key", "")]
            if action.get("element") not in (None, ""):
                self.cdp.call("DOM.focus", {"backendNodeId": self._node(action["element"])}, self.session)
            for key in keys:
                self._key(str(key))
            feedback = "pressed " + " ".join(map(str, keys))
        elif name == "scroll":
            direction = action.get("direction", "down")
            amount = float(action.get("amount") or self.height * 0.8)
            dx, dy = {"down": (0, amount), "up": (0, -amount), "right": (amount, 0), "left": (-amount, 0)}.get(
                direction, (None, None)
            )
            if dx is None:
                raise ActionError("scroll direction is up, down, left or right, got %r" % direction)
            if action.get("element") not in (None, ""):
                x, y = self._center(action["element"])
            else:
                x, y = float(action.get("x", self.width / 2)), float(action.get("y", self.height / 2))
            self._mouse("mouseWheel", x, y, button="none", clicks=0, deltaX=dx, deltaY=dy)
            feedback = "scrolled %s" % direction
        elif name == "drag":
            x1, y1, x2, y2 = (float(action[k]) for k in ("x1", "y1", "x2", "y2"))
            self._mouse("mouseMoved", x1, y1, button="none", clicks=0)
            self._mouse("mousePressed", x1, y1)
            for step in range(1, 6):
                self._mouse("mouseMoved", x1 + (x2 - x1) * step / 5, y1 + (y2 - y1) * step / 5, buttons=1)
            self._mouse("mouseReleased", x2, y2)
            feedback = "dragged from (%d, %d) to (%d, %d)" % (x1, y1, x2, y2)
        elif name == "goto":
            url = str(action.get("url", ""))
            self._check_url(url)
            result = self.cdp.call("Page.navigate", {"url": url}, self.session)
            if result.get("errorText"):
                raise ActionError("could not open %s: %s" % (url, result["errorText"]))
            navigating = True
            feedback = "opened " + url
        elif name == "go_back":
            history = self.cdp.call("Page.getNavigationHistory", session=self.session)
            if history["currentIndex"] == 0:
                raise ActionError("there is no previous page in this tab")
            entry = history["entries"][history["currentIndex"] - 1]
            self.cdp.call("Page.navigateToHistoryEntry", {"entryId": entry["id"]}, self.session)
            navigating = True
            feedback = "went back"
        elif name == "new_tab":
            url = str(action.get("url") or "about:blank")
            if url != "about:blank":
                self._check_url(url)
            self._attach(self.cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"])
            if url != "about:blank":
                self.cdp.call("Page.navigate", {"url": url}, self.session)
                navigating = True
            feedback = "opened a new tab (%d)" % self.current
        elif name == "switch_tab":
            index = int(action.get("index", -1))
            if not 0 <= index < len(self.tabs):
                raise ActionError("no tab %s; tabs are numbered 0 to %d" % (action.get("index"), len(self.tabs) - 1))
            self.current = index
            self.cdp.call("Page.bringToFront", session=self.session)
            feedback = "switched to tab %d" % index
        elif name == "close_tab":
            index = int(action.get("index", self.current))
            if len(self.tabs) == 1 or not 0 <= index < len(self.tabs):
                raise ActionError("cannot close tab %s (the last tab stays open)" % action.get("index"))
            self.cdp.call("Target.closeTarget", {"targetId": self.tabs.pop(index)["target"]})
            self.current = min(self.current, len(self.tabs) - 1) if index >= self.current else self.current - 1
            feedback = "closed tab %d" % index
        elif name == "wait":
            time.sleep(min(5.0, max(0.0, float(action.get("seconds", 1)))))
            feedback = "waited"
        elif name == "answer":
            self.answer = str(action.get("text", ""))
            feedback = "answer recorded: %s" % json.dumps(self.answer)
        else:
            raise ActionError("unknown action %r" % name)
        events = self._settle(navigating or self.input_navigated)
        if self._adopt_new_tabs(events):
            self._settle(True)
            feedback += "; a new tab opened (%d)" % self.current
        after = self._url()
        if after != before:
            feedback += "; now at " + after
        return feedback

    # -- observation -----------------------------------------------------------------------

    def _url(self):
        history = self.cdp.call("Page.getNavigationHistory", session=self.session)
        return history["entries"][history["currentIndex"]]["url"]

    def tree(self, nodes, budget=TREE_CHARS):
        by_id = {node["nodeId"]: node for node in nodes}
        lines = []
        size = 0

        def value(node, key):
            return (node.get(key) or {}).get("value", "")

        def walk(node, depth, parent_name):
            nonlocal size
            role = value(node, "role")
            if role in HIDDEN_ROLES:
                return
            name = str(value(node, "name")).strip()
            shown = not node.get("ignored") and not (role in SKIPPED_ROLES and not name)
            if role == "StaticText" and (not name or name == parent_name):
                shown = False
            if shown:
                parts = ["  " * depth + "[%s] %s" % (node.get("backendDOMNodeId", "?"), role)]
                if name:
                    parts.append(json.dumps(name, ensure_ascii=False))
                field_value = value(node, "value")
                if field_value not in ("", None) and role not in ("StaticText", "link"):
                    parts.append("value=%s" % json.dumps(str(field_value), ensure_ascii=False))
                for prop in node.get("properties", []):
                    if prop["name"] in SHOWN_PROPERTIES:
                        v = prop["value"].get("value")
                        if v is True:
                            parts.append(prop["name"])
                        elif prop["name"] == "level" and role != "heading":
                            continue
                        elif v not in (False, None, "false", "") and prop["name"] in (
                            "level",
                            "checked",
                            "expanded",
                            "invalid",
                        ):
                            parts.append("%s=%s" % (prop["name"], v))
                line = " ".join(parts)
                size += len(line) + 1
                lines.append(line)
            for child in node.get("childIds", []):
                if child in by_id:
                    walk(by_id[child], depth + 1 if shown else depth, name if shown else parent_name)

        walk(nodes[0], 0, "")
        text, kept = [], 0
        for line in lines:
            if kept + len(line) + 1 > budget:
                text.append(
                    "[... %d more lines of the tree cut; scroll or search to narrow ...]" % (len(lines) - len(text))
                )
                break
            kept += len(line) + 1
            text.append(line)
        return "\n".join(text)

    def screenshot(self):
        try:
            shot = self.cdp.call("Page.captureScreenshot", {"format": "png"}, self.session, timeout=SCREENSHOT_TIMEOUT)
        except Unanswered:
            # A page that produced no new frame (seen after a renderer swap under load) is
            # waiting to be shown: bring it to the front and ask once more.
            self.cdp.call("Page.bringToFront", session=self.session)
            shot = self.cdp.call("Page.captureScreenshot", {"format": "png"}, self.session)
        data = base64.b64decode(shot["data"])
        digest = hashlib.sha256(data).hexdigest()
        path = os.path.join(self.shots, digest + ".png")
        if not os.path.exists(path):
            with open(path + ".tmp", "wb") as out:
                out.write(data)
            os.replace(path + ".tmp", path)
        return digest, len(data)

    def _ax_nodes(self):
        return self.cdp.call("Accessibility.getFullAXTree", session=self.session)["nodes"]

    def _marked_screenshot(self, timings):
        """The screenshot with the marks drawn in, their text, and the tree's nodes read after
        it (of the same document as the marks). A document that changed under the marks (a navigation that started late) is
        marked again, once, so marks, screenshot and tree show the same page."""
        timings["marks"] = timings["screenshot"] = 0.0
        mark = time.monotonic()
        nodes = self._ax_nodes()
        timings["marks"] += time.monotonic() - mark
        for _attempt in range(2):
            mark = time.monotonic()
            found = marks.find(self.cdp, self.session, nodes, self.width, self.height)
            marks.draw(self.cdp, self.session, found)
            timings["marks"] += time.monotonic() - mark
            mark = time.monotonic()
            try:
                digest, size = self.screenshot()
            finally:
                marks.remove(self.cdp, self.session)  # the page goes on as the site made it
            timings["screenshot"] += time.monotonic() - mark
            mark = time.monotonic()
            after = self._ax_nodes()
            timings["tree"] = time.monotonic() - mark
            if after[0].get("backendDOMNodeId") == nodes[0].get("backendDOMNodeId"):
                return digest, size, marks.text(found) + "\n", after
            nodes = after
        return digest, size, marks.text(found) + "\n", nodes

    def observe(self, feedback, timings):
        # The screenshot comes first: capturing a frame waits for the page to lay out, so a
        # navigation that started late (a loaded host) is in the tree read after it.
        if self.with_marks:
            digest, size, marks_text, nodes = self._marked_screenshot(timings)
        else:
            mark = time.monotonic()
            digest, size = self.screenshot()
            timings["screenshot"] = time.monotonic() - mark
            marks_text, nodes = "", None
        mark = time.monotonic()
        tree = self.tree(nodes or self._ax_nodes(), TREE_CHARS - len(marks_text))
        timings["tree"] = timings.get("tree", 0.0) + time.monotonic() - mark
        targets = {t["targetId"]: t for t in self.cdp.call("Target.getTargets")["targetInfos"]}
        tabs = []
        for index, tab in enumerate(self.tabs):
            info = targets.get(tab["target"], {})
            tabs.append(
                "%s[%d] %s" % ("*" if index == self.current else "", index, info.get("title") or info.get("url", ""))
            )
        if digest == self.last_shot and feedback.startswith(("clicked", "hovered", "pressed", "scrolled", "dragged")):
            feedback += "; no visible change"
        self.last_shot = digest
        if not self.shot_history or self.shot_history[-1] != digest:
            self.shot_history = (self.shot_history + [digest])[-10:]
        header = [
            "feedback: " + feedback,
            "url: " + self._url(),
            "tabs: " + " | ".join(tabs),
            "screenshot: sha256=%s %dx%d %d bytes%s"
            % (digest, self.width, self.height, size, " set-of-marks" if self.with_marks else ""),
            "timing_ms: " + " ".join("%s=%.1f" % (k, v * 1000) for k, v in timings.items()),
        ]
        return "\n".join(header) + "\n" + marks_text + "---\n" + tree + "\n"

    def grade(self, request):
        values = []
        for expression in request.get("js", []) if not self.crashed else []:
            try:
                result = self.cdp.call(
                    "Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session
                )
                values.append(result.get("result", {}).get("value"))
            except ActionError as exc:
                values.append({"error": str(exc)})
            except BrowserGone as exc:
                self.crashed = str(exc)
                break
        url = ""
        if not self.crashed:
            try:
                url = self._url()
            except (ActionError, BrowserGone) as exc:
                self.crashed = self.crashed or str(exc)
        body = json.dumps(
            {
                "answer": self.answer,
                "url": url,
                "js": values,
                "actions": self.actions,
                "errors": self.errors,
                "crashed": self.crashed,
                "shots": self.shot_history,
            },
            sort_keys=True,
        ).encode()
        states = {}
        for site, ask in (request.get("state") or {}).items():
            # Relayed as received: the site signs its own state, so this relay cannot alter it.
            query = urllib.parse.urlencode({"nonce": request.get("nonce", ""), "sig": ask.get("sig", "")})
            try:
                with urllib.request.urlopen(
                    "http://127.0.0.1:%d/__state?%s" % (int(ask["port"]), query), timeout=10
                ) as reply:
                    states[site] = {
                        "body": reply.read().decode(),
                        "signature": reply.headers.get("X-Orchard-Signature", ""),
                    }
            except Exception as exc:  # the grader decides what a missing state means
                states[site] = {"error": "%s: %s" % (type(exc).__name__, exc)}
        return json.dumps(
            {"body": body.decode(), "signature": sign(self.key, str(request.get("nonce", "")), body), "states": states}
        )

    def handle(self, request):
        if request.get("op") == "grade":
            return self.grade(request)
        if self.crashed:
            return "error: the browser crashed (%s)\n" % self.crashed
        timings = {}
        mark = time.monotonic()
        try:
            if request.get("op") == "observe":
                feedback = "observed"
            else:
                self.actions += 1
                try:
                    feedback = self.act(request)
                except ActionError as exc:
                    self.errors += 1
                    feedback = "error: %s" % exc
                except (KeyError, TypeError, ValueError) as exc:
                    self.errors += 1
                    feedback = "error: malformed %s action (%s: %s)" % (request.get("action"), type(exc).__name__, exc)
            timings["action"] = time.monotonic() - mark
            return self.observe(feedback, timings)
        except BrowserGone as exc:
            self.crashed = str(exc)
            return "error: the browser crashed (%s)\n" % exc


class Channel:
    """Requests on a FIFO held open read-write (never EOF), replies on a second FIFO."""

    def __init__(self, run_dir):
        self.req_path, self.resp_path = os.path.join(run_dir, "req"), os.path.join(run_dir, "resp")
        for path in (self.req_path, self.resp_path):
            if os.path.exists(path):
                os.unlink(path)
            os.mkfifo(path, 0o600)
        self.fd = os.open(self.req_path, os.O_RDWR | os.O_NONBLOCK)
        self.buffer = b""

    def read_requests(self):
        try:
            chunk = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return []
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line for line in lines if line.strip()]

    def reply(self, text):
        deadline = time.monotonic() + 5.0
        while True:
            try:
                fd = os.open(self.resp_path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    return  # the client went away; its step already failed
                time.sleep(0.001)
        os.set_blocking(fd, True)
        data = text.encode()
        try:
            while data:
                data = data[os.write(fd, data) :]
        except BrokenPipeError:
            pass
        finally:
            os.close(fd)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--which", action="store_true", help="print the chromium this driver would start, and exit")
    parser.add_argument("--run")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--any-host", action="store_true", help="live mode: any site may be opened")
    parser.add_argument("--marks", action="store_true", help="set-of-marks observations (see marks.py)")
    args = parser.parse_args()
    if args.which:  # the host's `doctor` asks the driver itself: one list of candidates
        print(find_chromium())
        return
    if not args.run:
        parser.error("--run is required")
    key = read_key()
    make_undumpable()
    allowed = None if args.any_host else {"127.0.0.1", "localhost"}
    browser = Browser(args.run, args.width, args.height, key, allowed, with_marks=args.marks)
    channel = Channel(args.run)
    with open(os.path.join(args.run, "browser.ready"), "w") as ready:
        ready.write("%d\n" % browser.process.pid)
    while True:
        watched = [channel.fd] if browser.crashed else [channel.fd, browser.cdp.read_fd]
        readable, _, _ = select.select(watched, [], [], 1.0)
        if browser.cdp.read_fd in readable and not browser.crashed:
            try:
                browser.cdp.pump(0)
                browser.cdp.events = browser.cdp.events[-200:]  # events of idle time: only recent ones matter
            except BrowserGone as exc:
                browser.crashed = str(exc)
        if channel.fd in readable:
            for line in channel.read_requests():
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ValueError("not an object")
                except ValueError as exc:
                    channel.reply("error: the request is not a JSON object (%s)\n" % exc)
                    continue
                try:
                    reply = browser.handle(request)
                except Exception as exc:  # a bug of ours: the step fails loudly, the driver stays up
                    traceback.print_exc()
                    reply = "error: the browser driver failed (%s: %s)\n" % (type(exc).__name__, exc)
                channel.reply(reply)


if __name__ == "__main__":
    main()
