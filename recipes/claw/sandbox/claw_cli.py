"""The Claw services' command line, on the sandbox's PATH. Standard library only.

    claw tools [SERVICE]                     what the task offers (with arguments)
    claw SERVICE TOOL [--arg VALUE]...       one call, e.g. `mail list --unread`, `mail read --id m1`
    claw SERVICE TOOL --json '{"id": "m1"}'  arguments as one JSON object
    claw answer TEXT                          the final answer to the user (`-` reads stdin)
    ask QUESTION                              ask the user (multi-turn tasks)
    claw batch < calls.json                   [{"id", "name", "arguments"}...] -> [{"id", "content"}...]
    claw mcp                                  the same tools as an MCP server over stdio (claw_mcp.py)

Each service also has its own command (`mail ...`, `calendar ...`). The result is printed as
JSON. Exit status: 0 done, 1 refused (bad arguments, not found), 75 temporary failure (429 or
500: try again), 69 the services cannot be reached.
"""

import json
import os
import sys
import urllib.error
import urllib.request

HOME = os.environ.get("CLAW_HOME", "/tmp/claw")
TEMPORARY = 75  # EX_TEMPFAIL
UNREACHABLE = 69  # EX_UNAVAILABLE


def base_url():
    if os.environ.get("CLAW_URL"):
        return os.environ["CLAW_URL"].rstrip("/")
    with open(os.path.join(HOME, "port")) as f:
        return f"http://127.0.0.1:{f.read().strip()}"


def request(method, path, payload=None, via="cli"):
    """(HTTP status, decoded JSON reply); status 0 when nothing answered."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(base_url() + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("X-Claw-Via", via)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as reply:
            return reply.status, json.loads(reply.read().decode() or "null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read().decode() or "null")
        except ValueError:
            return exc.code, {"ok": False, "error": f"HTTP {exc.code}"}
    except (OSError, ValueError) as exc:
        return 0, {"ok": False, "error": f"the services cannot be reached: {exc}"}


def catalogue():
    with open(os.path.join(HOME, "tools.json")) as f:
        return {entry["name"]: entry for entry in json.load(f)}


def parse_args(spec, argv):
    """``--name value`` pairs (``--flag`` alone for booleans) and ``--json OBJECT`` -> arguments."""
    props = spec["parameters"]["properties"]
    args, i = {}, 0
    while i < len(argv):
        word = argv[i]
        if word == "--json" and i + 1 < len(argv):
            args.update(json.loads(argv[i + 1]))
            i += 2
            continue
        if not word.startswith("--"):
            raise SystemExit(f"claw: unexpected {word!r}: arguments are --name value")
        name = word[2:].replace("-", "_")
        prop = props.get(name)
        if prop is None:
            raise SystemExit(
                "claw: {} takes no --{} (it takes: {})".format(spec["name"], name, ", ".join("--" + p for p in props))
            )
        kind = prop.get("type", "string")
        if kind == "boolean" and (i + 1 >= len(argv) or argv[i + 1] not in ("true", "false")):
            args[name], i = True, i + 1
            continue
        if i + 1 >= len(argv):
            raise SystemExit(f"claw: --{name} needs a value")
        value = argv[i + 1]
        if kind == "integer":
            value = int(value)
        elif kind == "number":
            value = float(value)
        elif kind == "boolean":
            value = value == "true"
        elif kind in ("array", "object"):  # a task's own schemas (Claw-Eval's) take lists and objects as JSON
            value = json.loads(value)
        args[name] = value
        i += 2
    return args


def call(name, args, via="cli"):
    service, _, tool = name.partition(".")
    return request("POST", f"/call/{service}/{tool}", args, via)


def show(status, reply):
    if status == 200:
        print(json.dumps(reply.get("result"), indent=2, ensure_ascii=False))
        return 0
    error = reply.get("error", "") if isinstance(reply, dict) else str(reply)
    sys.stderr.write("error {}: {}\n".format(status or "-", error))
    if status == 0:
        return UNREACHABLE
    return TEMPORARY if status in (429, 500, 502, 503) else 1


def usage(tools, service=None):
    lines = []
    for name, spec in sorted(tools.items()):
        if service and not name.startswith(service + "."):
            continue
        props = spec["parameters"]["properties"]
        required = spec["parameters"].get("required", [])
        flags = " ".join(
            ("--%s %s" if p in required else "[--%s %s]") % (p, str(props[p].get("type", "string")).upper())
            for p in props
        )
        lines.append("{} {} {}\n    {}".format(name.split(".")[0], name.split(".")[1], flags, spec["description"]))
    return "\n".join(lines)


def batch():
    """Several calls from stdin (the function-calling policy's tool calls), one JSON reply."""
    results = []
    for item in json.load(sys.stdin):
        name = str(item.get("name", "")).replace("__", ".")
        arguments = item.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as exc:
                results.append(
                    {
                        "id": item.get("id"),
                        "content": json.dumps({"ok": False, "error": f"arguments are not JSON: {exc}"}),
                    }
                )
                continue
        status, reply = call(name, arguments if arguments is not None else {}, via="function")
        if isinstance(reply, dict):
            reply = dict(reply, status=status)
        results.append({"id": item.get("id"), "content": json.dumps(reply, ensure_ascii=False)})
    print(json.dumps(results, ensure_ascii=False))
    return 0


def main(argv):
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    command = argv[0]
    if command == "batch":
        return batch()
    if command == "mcp":
        import claw_mcp  # next to this file in the sandbox

        return claw_mcp.serve()
    if command == "_snapshot":
        status, reply = request("POST", "/_control/snapshot", {"nonce": argv[1]}, via="control")
        print(json.dumps({"status": status, "reply": reply}))
        return 0 if status == 200 else 1
    if command == "_reset":
        status, reply = request("POST", "/_control/reset", {"nonce": argv[1], "mac": argv[2]}, via="control")
        return show(status, reply)
    tools = catalogue()
    if command == "tools":
        print(usage(tools, argv[1] if len(argv) > 1 else None))
        return 0
    if command == "answer":
        text = sys.stdin.read() if argv[1:] == ["-"] else " ".join(argv[1:])
        return show(*call("agent.answer", {"text": text}))
    if command == "ask":
        return show(*call("user.ask", {"question": " ".join(argv[1:])}))
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(usage(tools, command) or f"claw: no service {command!r}; `claw tools` lists them")
        return 0 if len(argv) > 1 else 1
    name = f"{command}.{argv[1]}"
    spec = tools.get(name)
    if spec is None:
        sys.stderr.write(f"claw: no tool {name} in this task; `claw tools` lists them\n")
        return 1
    try:
        args = parse_args(spec, argv[2:])
    except ValueError as exc:
        sys.stderr.write(f"claw: {exc}\n")
        return 1
    return show(*call(name, args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
