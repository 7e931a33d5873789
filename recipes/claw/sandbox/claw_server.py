"""Mock personal-assistant services for Claw tasks, run INSIDE the sandbox (network off).

Standard library only (any python3 >= 3.8), copied into every sandbox with the tools it
serves (``claw_tools.py``: the catalogue, the validator and every tool).

One process serves every service over HTTP on the sandbox's loopback:

    POST /call/<service>/<tool>   JSON arguments -> {"ok": true, "result": ...} or {"ok": false, "error": ...}
    GET  /tools                   the catalogue offered in this task (name, description, JSON Schema)
    POST /_control/snapshot       {"nonce"} -> {"body": JSON text, "mac": HMAC-SHA256(key, body)}
    POST /_control/reset          {"nonce", "mac": HMAC(key, "reset:" + nonce)} -> back to the seeded state
    GET  /_control/health

Every tool call is audited (its arguments, its outcome, the state it changed). Faults (429/500
replies, added latency) are injected on tool calls only, never on the control endpoints.

Why the grader can trust the audit although the agent shares the sandbox: the key arrives on
stdin at start (never in argv, the environment or a file left behind: the stdin spool file is
truncated), the process is made non-dumpable (no ptrace, no /proc/<pid>/mem for the agent's
processes), and the controller asks for a snapshot with a fresh nonce and checks the MAC. An
agent that kills the server, starts its own, or forges a snapshot file cannot produce a MAC.
"""

import copy
import hashlib
import hmac
import json
import os
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

# In the sandbox the files next to this one win over an orchard_async the sandbox's python may also
# see (the local adapter's), whose version may differ.
if __package__:
    from orchard_async.recipes.claw.sandbox import claw_eval_services
    from orchard_async.recipes.claw.sandbox import claw_tools as tools  # the controller imports this package
else:
    import claw_eval_services  # type: ignore[no-redef]
    import claw_tools as tools  # in the sandbox, next to this file

MAX_BODY = 64 * 1024  # bytes per request
MAX_CALLS = 2000  # audited tool calls per sandbox; later calls are refused (and counted)

# -- the server -------------------------------------------------------------------------------------


class Services:
    def __init__(self, config):
        self.key = config["key"].encode()
        self.seed_world = config.get("world") or {}
        self.offered = set(config.get("tools") or tools.TOOLS) | set(tools.ALWAYS_OFFERED)
        self.faults = config.get("faults") or {}
        self.user_model = config.get("user_model")  # {"url", "key", "model", "goal"}: an LLM plays the user
        # Claw-Eval's services of this task: its tools join the catalogue, its endpoints the routes
        self.claw_eval = config.get("claw_eval") or {}
        self.endpoints: dict = {}  # (path, method) -> tool name
        claw_eval_services.register(self.claw_eval, self.endpoints)
        self.lock = threading.Lock()
        self.used_nonces = set()
        self.reset()

    def reset(self):
        world = copy.deepcopy(tools.EMPTY_WORLD)
        for name, value in copy.deepcopy(self.seed_world).items():
            if isinstance(value, dict) and isinstance(world.get(name), dict):
                world[name].update(value)
            else:
                world[name] = value
        self.world = world
        self.audit = []
        self.refused = 0
        self.calls_per_tool = {}
        self.rng = random.Random(self.faults.get("seed", 0))
        self.started = time.time()

    def _fault(self, name):
        """The injected status for this call of ``name`` (None: serve it)."""
        if name in tools.NO_FAULTS or not self.faults:
            return None
        only = self.faults.get("tools")
        if only and name not in only:
            return None
        statuses = self.faults.get("statuses") or [429, 500]
        count = self.calls_per_tool.get(name, 0)
        first = (self.faults.get("fail_first") or {}).get(name, 0)
        if count < first:
            return statuses[count % len(statuses)]
        rate = float(self.faults.get("rate") or 0)
        if rate and self.rng.random() < rate:
            return self.rng.choice(statuses)
        return None

    def call(self, name, args, via):
        """(HTTP status, reply) for one tool call, audited."""
        latency = float(self.faults.get("latency_ms") or 0) / 1000 if name not in tools.NO_FAULTS else 0.0
        if latency:
            time.sleep(latency)
        with self.lock:
            if len(self.audit) >= MAX_CALLS:
                self.refused += 1
                return 429, {"ok": False, "error": f"call limit of this task reached ({MAX_CALLS} calls)"}
            entry = {
                "seq": len(self.audit) + 1,
                "t": round(time.time() - self.started, 3),
                "tool": name,
                "args": tools.clip(args),
                "via": via,
            }
            self.audit.append(entry)
            status, reply, changes = self._dispatch(name, args)
            entry.update({"status": status, "ok": status == 200, "changes": changes.items})
            if status != 200:
                entry["error"] = reply.get("error", "")
            elif (tools.TOOLS.get(name) or {}).get("loose"):  # a Claw-Eval tool: its graders read the response
                entry["response"] = tools.clip(reply.get("result"))
            if reply.get("fault"):
                entry["fault"] = status
            return status, reply

    def _dispatch(self, name, args):
        changes = tools.Changes()
        spec = tools.TOOLS.get(name)
        if spec is None:
            return 404, {"ok": False, "error": f"unknown tool {name!r}; GET /tools lists them"}, changes
        if name not in self.offered:
            return 403, {"ok": False, "error": f"tool {name!r} is not available in this task"}, changes
        problem = (tools.validate_loose if spec.get("loose") else tools.validate)(spec["schema"], args)
        if problem:
            return 400, {"ok": False, "error": problem}, changes
        fault = self._fault(name)
        self.calls_per_tool[name] = self.calls_per_tool.get(name, 0) + 1
        if fault:
            text = "Too Many Requests: slow down and retry" if fault == 429 else "Internal Server Error: try again"
            return fault, {"ok": False, "error": text, "fault": True}, changes
        try:
            if name == "user.ask" and self.user_model:
                result = tools.user_ask(self.world, args, changes, self.user_model)
            else:
                result = spec["fn"](self.world, args, changes)
        except tools.ToolError as exc:
            return exc.status, {"ok": False, "error": str(exc)}, changes
        return 200, {"ok": True, "result": result}, changes

    def reset_service(self, name):
        """A Claw-Eval service back to its fixtures (its ``reset_endpoint``); the audit of calls stays."""
        seeded = (self.seed_world.get("claw_eval") or {}).get(name)
        if seeded is not None:
            self.world.setdefault("claw_eval", {})[name] = copy.deepcopy(seeded)

    def claw_eval_route(self, method, path, via):
        """(status, reply) for a request on one of Claw-Eval's endpoints, or None: not one of them."""
        for service in self.claw_eval.get("services") or []:
            name = service["name"]
            if method == "GET" and path == f"/{name}/audit":
                with self.lock:
                    return 200, copy.deepcopy((self.world.get("claw_eval") or {}).get(name, {}).get("audit", {}))
            if via == "health" and path == service.get("health") and method == service.get("health_method", "POST"):
                return 200, {"status": "ok", "service": name}
        tool = self.endpoints.get((path, method))
        if tool is not None:
            return None
        for service in self.claw_eval.get("services") or []:
            if path == service.get("health"):
                return 200, {"status": "ok", "service": service["name"]}
        return 404, {"ok": False, "error": f"no route {method} {path}"}

    def snapshot(self, nonce):
        with self.lock:
            body = json.dumps(
                {"nonce": nonce, "audit": self.audit, "world": self.world, "refused": self.refused, "pid": os.getpid()},
                sort_keys=True,
            )
        return {"body": body, "mac": hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()}

    def authorised(self, what, nonce, mac):
        expected = hmac.new(self.key, (f"{what}:{nonce}").encode(), hashlib.sha256).hexdigest()
        with self.lock:
            if not isinstance(nonce, str) or nonce in self.used_nonces or not hmac.compare_digest(expected, str(mac)):
                return False
            self.used_nonces.add(nonce)
        return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    services = None  # set by serve()

    def log_message(self, *args):  # quiet: the audit is the log
        pass

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(data)

    def _body(self):
        size = int(self.headers.get("Content-Length") or 0)
        if size > MAX_BODY:
            raise ValueError(f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(size) if size else b"{}"
        return json.loads(raw.decode() or "{}")

    def do_GET(self):
        if self.path == "/tools":
            return self._send(200, tools.catalogue(self.services.offered))
        if self.path == "/_control/health":
            return self._send(200, {"ok": True})
        if self._claw_eval("GET", {}):
            return None
        self._send(404, {"ok": False, "error": f"no route GET {self.path}"})

    def _claw_eval(self, method, body):
        """Serve a request on Claw-Eval's endpoints (True when it was one): a tool endpoint is a
        tool call like /call, audited ``via: endpoint``; ``/<service>/audit`` reads a service's audit;
        its reset endpoint needs the controller's MAC, as /_control/reset does."""
        services = cast(Services, self.services)
        if not services.claw_eval:
            return False
        path = self.path.split("?", 1)[0]
        via = self.headers.get("X-Claw-Via", "endpoint")
        for service in services.claw_eval.get("services") or []:
            if method == "POST" and path == service.get("reset"):
                if not isinstance(body, dict) or not services.authorised("reset", body.get("nonce"), body.get("mac")):
                    self._send(403, {"ok": False, "error": "reset needs the controller's MAC"})
                    return True
                with services.lock:
                    services.reset_service(service["name"])
                self._send(200, {"ok": True})
                return True
        routed = services.claw_eval_route(method, path, via)
        if routed is None:
            status, reply = services.call(services.endpoints[(path, method)], body, via)
            # Claw-Eval's services answer with the result itself; an error keeps its status
            self._send(status, reply.get("result") if status == 200 else reply)
            return True
        if routed[0] == 404:
            return False
        self._send(*routed)
        return True

    def do_POST(self):
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError) as exc:
            return self._send(400, {"ok": False, "error": f"unreadable request: {exc}"})
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "call":
            status, reply = self.services.call(parts[1] + "." + parts[2], body, self.headers.get("X-Claw-Via", "http"))
            return self._send(status, reply)
        if self.path == "/_control/snapshot" and isinstance(body, dict):
            return self._send(200, self.services.snapshot(str(body.get("nonce", ""))))
        if self._claw_eval("POST", body):
            return None
        if self.path == "/_control/reset" and isinstance(body, dict):
            if not self.services.authorised("reset", body.get("nonce"), body.get("mac")):
                return self._send(403, {"ok": False, "error": "reset needs the controller's MAC"})
            with self.services.lock:
                self.services.reset()
            return self._send(200, {"ok": True})
        self._send(404, {"ok": False, "error": f"no route POST {self.path}"})


def _not_dumpable():
    """No ptrace and no /proc/<pid>/mem for other processes of the same user (the agent's)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
    except Exception:
        return False


def _scrub_stdin():
    """The shell protocol spools a command's stdin to a file: empty it, the key was in it."""
    try:
        path = os.readlink("/proc/self/fd/0")
        if os.path.isfile(path):
            with open(path, "wb"):
                pass
    except OSError:
        pass


def serve(log_path):
    """Read the config from stdin, bind, print the port, and serve in a detached child."""
    _not_dumpable()
    config = json.loads(sys.stdin.readline())
    _scrub_stdin()
    Handler.services = Services(config)
    server = ThreadingHTTPServer(("127.0.0.1", int(config.get("port") or 0)), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    extra = _claw_eval_servers(config, os.path.join(os.path.dirname(os.path.abspath(log_path)), "ports.json"))
    if os.fork():
        sys.stdout.write(f"{port}\n")
        sys.stdout.flush()
        os._exit(0)
    os.setsid()
    _not_dumpable()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    keep = {server.socket.fileno()} | {other.socket.fileno() for other in extra}
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for other in extra:
        threading.Thread(target=other.serve_forever, daemon=True).start()
    server.serve_forever()


def _claw_eval_servers(config, ports_path):
    """One listener per Claw-Eval service on the port its task declares (another free port when
    that one is taken: the actual ports go to ``ports_path``), all answering the same routes."""
    servers, ports = [], {}
    for service in (config.get("claw_eval") or {}).get("services") or []:
        wanted = int(service.get("port") or 0)
        try:
            listener = ThreadingHTTPServer(("127.0.0.1", wanted), Handler)
        except OSError:
            listener = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        listener.daemon_threads = True
        servers.append(listener)
        ports[service["name"]] = {"declared": wanted, "port": listener.server_address[1]}
    if servers:
        with open(ports_path, "w") as f:
            json.dump(ports, f)
    return servers


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit("usage: claw_server.py serve LOG_PATH  (config as one JSON line on stdin)")
