"""The controller's side of the mock services: install and start them in a sandbox, and read
back a snapshot of their audit and state that the agent cannot have forged.

Everything lives in ``/tmp/claw`` of the sandbox (private per sandbox on every adapter with
isolation): the server, the CLI, one command per service in ``/tmp/claw/bin`` (first on the
sandbox's ``PATH``, see ``SANDBOX_PATH``) and ``python3``/``python`` shims when the adapter's
interpreter is not on the system path (the local adapter's is in ``$ORCHARD_SANDBOX/bin``).

The server gets a fresh random key on stdin; the controller keeps it. A snapshot is asked for
with a fresh nonce and is believed only when its MAC checks out and it names that nonce.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard_async import ExecResult, Sandbox, SandboxLost
from orchard_async.recipes.claw.sandbox import claw_tools

HOME = "/tmp/claw"
BIN = f"{HOME}/bin"
SANDBOX_PATH = f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVICE_COMMANDS = (*claw_tools.SERVICES, "claw", "ask", "answer")
SOURCES = Path(__file__).parent / "sandbox"
START_TIMEOUT = 60.0
SNAPSHOT_TIMEOUT = 60.0

# Prints the snapshot reply compressed (base64 of zlib), so a large audit stays one short line.
SNAPSHOT_SCRIPT = """\
import base64, json, sys, urllib.request, zlib
port, nonce = sys.argv[1], sys.argv[2]
req = urllib.request.Request("http://127.0.0.1:%s/_control/snapshot" % port, data=json.dumps({"nonce": nonce}).encode(),
                             method="POST", headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(req, timeout=50) as reply:
    sys.stdout.write(base64.b64encode(zlib.compress(reply.read())).decode())
"""

RESET_SCRIPT = """\
import json, sys, urllib.request
port, nonce, mac = sys.argv[1:4]
req = urllib.request.Request("http://127.0.0.1:%s/_control/reset" % port,
                             data=json.dumps({"nonce": nonce, "mac": mac}).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(req, timeout=50) as reply:
    sys.stdout.write(reply.read().decode())
"""


class ServicesUnavailable(Exception):
    """The services could not be started (a task or image problem, not the agent's)."""


@dataclass
class ServiceHandle:
    """What the controller keeps about one sandbox's services: never shown to the agent."""

    key: bytes
    port: int
    python: str


@dataclass
class Snapshot:
    """The services' audit and final state, or why there is none the grader can trust."""

    audit: list[dict[str, Any]]
    world: dict[str, Any]
    problem: str = ""  # non-empty: no trusted snapshot (the services were stopped, replaced or forged)

    @property
    def trusted(self) -> bool:
        return not self.problem


def _heredoc(path: str, text: str) -> str:
    tag = "CLAW_EOF"
    while tag in text:
        tag += "_"
    return f"cat > {path} <<'{tag}'\n{text}{'' if text.endswith(chr(10)) else chr(10)}{tag}\n"


def install_script(tools_json: str, extra_commands: tuple[str, ...] = ()) -> str:
    """The shell script that installs the services and starts the server (config on stdin);
    ``extra_commands``: more service commands (a Claw-Eval task's services)."""
    shims = " ".join(dict.fromkeys((*SERVICE_COMMANDS, *extra_commands)))
    return (
        "set -e\n"
        'PY=python3\nif [ -n "$ORCHARD_SANDBOX" ] && [ -x "$ORCHARD_SANDBOX/bin/python3" ]; then PY="$ORCHARD_SANDBOX/bin/python3"; fi\n'
        'PY=$(command -v "$PY") || { echo "claw: no python3 in the sandbox" >&2; exit 3; }\n'
        f'if [ -e {HOME} ]; then echo "claw: {HOME} already exists: the services need a private /tmp per sandbox" >&2; exit 3; fi\n'
        f"mkdir -p {BIN}\n"
        + _heredoc(f"{HOME}/claw_server.py", (SOURCES / "claw_server.py").read_text())
        + _heredoc(f"{HOME}/claw_tools.py", (SOURCES / "claw_tools.py").read_text())
        + _heredoc(f"{HOME}/claw_cli.py", (SOURCES / "claw_cli.py").read_text())
        + _heredoc(f"{HOME}/claw_mcp.py", (SOURCES / "claw_mcp.py").read_text())
        + _heredoc(f"{HOME}/claw_user.py", (SOURCES / "claw_user.py").read_text())
        + _heredoc(f"{HOME}/claw_eval_services.py", (SOURCES / "claw_eval_services.py").read_text())
        + _heredoc(f"{HOME}/tools.json", tools_json)
        + f"for name in {shims}; do\n"
        "  case $name in claw) sub= ;; *) sub=$name ;; esac\n"
        f'  printf \'#!/bin/sh\\nexec "%s" {HOME}/claw_cli.py %s "$@"\\n\' "$PY" "$sub" > {BIN}/$name\n'
        f"  chmod 755 {BIN}/$name\n"
        "done\n"
        f'case $PY in /usr/bin/*|/bin/*|/usr/local/bin/*) ;; *) for name in python3 python; do ln -s "$PY" {BIN}/$name; done ;; esac\n'
        f'"$PY" {HOME}/claw_server.py serve {HOME}/server.log > {HOME}/port\n'
        f'printf "%s %s\\n" "$(cat {HOME}/port)" "$PY"\n'
    )


def _check(result: ExecResult, what: str) -> None:
    if result.reason.is_infra:
        raise SandboxLost(f"{what}: {result.error_text or result.reason.value}")


async def start(
    sandbox: Sandbox,
    *,
    world: dict[str, Any],
    tools: list[str] | None,
    faults: dict[str, Any] | None,
    user_model: dict[str, Any] | None = None,
    claw_eval: dict[str, Any] | None = None,
) -> ServiceHandle:
    """Install the services in ``sandbox`` and start them seeded with ``world`` (``user_model``:
    where the simulated user's model is, as the sandbox reaches it; see ``simulated_user``;
    ``claw_eval``: a Claw-Eval task's services and tools, see ``sandbox/claw_eval_services``)."""
    key = secrets.token_hex(32)
    offered = claw_tools.catalogue(set(tools) if tools is not None else None)
    extra = (claw_eval or {}).get("tools") or []
    offered += [{"name": t["name"], "description": t["description"], "parameters": t["schema"]} for t in extra]
    config = {
        "key": key, "world": world, "tools": tools, "faults": faults or {}, "user_model": user_model,
        "claw_eval": claw_eval,
    }  # fmt: skip
    commands = tuple(s["name"] for s in (claw_eval or {}).get("services") or [])
    result = await sandbox.exec(
        install_script(json.dumps(offered, indent=1), commands),
        stdin=(json.dumps(config) + "\n").encode(),
        timeout=START_TIMEOUT,
    )
    _check(result, "starting the claw services")
    if not result.ok:
        raise ServicesUnavailable(
            f"the claw services did not start: {(result.error_text or result.text).strip()[-500:]}"
        )
    port, _, python = result.text.strip().partition(" ")
    handle = ServiceHandle(key=key.encode(), port=int(port), python=python)
    if claw_eval and claw_eval.get("services"):
        await _health_checks(sandbox, handle, claw_eval["services"])
    return handle


# Each Claw-Eval service's health check as its task declares it (path and method), on the port it got.
HEALTH_SCRIPT = """\
import json, sys, urllib.request
checks, ports = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for name, path, method in checks:
    req = urllib.request.Request("http://127.0.0.1:%s%s" % (ports[name]["port"], path), data=b"{}" if method == "POST" else None,
                                 method=method, headers={"Content-Type": "application/json", "X-Claw-Via": "health"})
    with opener.open(req, timeout=20) as reply:
        if reply.status != 200:
            sys.exit("%s: health check %s %s answered %s" % (name, method, path, reply.status))
"""


async def _health_checks(sandbox: Sandbox, handle: ServiceHandle, declared: list[dict[str, Any]]) -> None:
    checks = [[s["name"], s["health"], s.get("health_method", "POST")] for s in declared if s.get("health")]
    if not checks:
        return
    result = await sandbox.exec(
        f"{handle.python} - {shlex.quote(json.dumps(checks))} {HOME}/ports.json",
        stdin=HEALTH_SCRIPT.encode(),
        timeout=START_TIMEOUT,
    )
    _check(result, "checking the Claw-Eval services' health")
    if not result.ok:
        raise ServicesUnavailable(f"a Claw-Eval service failed its health check: {result.error_text.strip()[-300:]}")


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


async def snapshot(sandbox: Sandbox, handle: ServiceHandle) -> Snapshot:
    """The audit and final state, believed only with a valid MAC over a fresh nonce."""
    nonce = secrets.token_hex(16)
    result = await sandbox.exec(
        f"{handle.python} - {handle.port} {nonce}", stdin=SNAPSHOT_SCRIPT.encode(), timeout=SNAPSHOT_TIMEOUT
    )
    _check(result, "reading the claw services' audit")
    if not result.ok:
        return Snapshot(
            [], {}, f"the services did not answer ({result.reason.value}): {result.error_text.strip()[-300:]}"
        )
    if result.stdout_cut:
        return Snapshot([], {}, "the services' snapshot is larger than the output cap")
    try:
        reply = json.loads(zlib.decompress(base64.b64decode(result.stdout, validate=True)))
        body, mac = reply["body"], reply["mac"]
    except (ValueError, KeyError, TypeError, zlib.error) as exc:
        return Snapshot([], {}, f"the services' snapshot is unreadable: {type(exc).__name__}")
    if not isinstance(body, str) or not hmac.compare_digest(_mac(handle.key, body), str(mac)):
        return Snapshot([], {}, "the services' snapshot has no valid MAC: forged, or the server was replaced")
    data = json.loads(body)
    if data.get("nonce") != nonce:
        return Snapshot([], {}, "the services' snapshot answers another nonce: a replay")
    return Snapshot(data["audit"], data["world"])


async def reset(sandbox: Sandbox, handle: ServiceHandle) -> None:
    """Back to the seeded state with an empty audit (authorised by the key)."""
    nonce = secrets.token_hex(16)
    result = await sandbox.exec(
        f"{handle.python} - {handle.port} {nonce} {_mac(handle.key, 'reset:' + nonce)}",
        stdin=RESET_SCRIPT.encode(),
        timeout=SNAPSHOT_TIMEOUT,
    )
    _check(result, "resetting the claw services")
    if not result.ok:
        raise ServicesUnavailable(f"the claw services did not reset: {result.error_text.strip()[-300:]}")
