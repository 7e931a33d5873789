"""A small terminal agent harness (stdlib only) that runs inside a Harbor task's sandbox: the
instruction on stdin, the model at OPENAI_BASE_URL (the controller's recording proxy), one
function, ``bash``, whose command runs in the working directory; a reply without a tool call
ends the run. HARBOR_MAX_TURNS bounds the model calls, HARBOR_COMMAND_TIMEOUT each command.

Exit status: 0 done, 3 out of turns, 4 the model failed."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

SYSTEM = (
    "You are an agent working in a Linux terminal to complete a task. Run shell commands with the "
    "bash tool, one or more per reply; you see each command's exit status and output. Commands run "
    "in the task's working directory, each in a fresh shell. When the task is done, reply with a "
    "short summary and no tool call. Tests you cannot see check your work afterwards."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command; returns its exit status and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command"}},
            "required": ["command"],
        },
    },
}
BASE = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ.get("OPENAI_API_KEY", "")
MODEL = os.environ.get("OPENAI_MODEL", "default")
OUTPUT_CHARS = 10_000
SHELL = shutil.which("bash") or "/bin/sh"
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(messages):
    body = json.dumps({"model": MODEL, "messages": messages, "tools": [BASH_TOOL]}).encode()
    for attempt in range(4):
        request = urllib.request.Request(BASE + "/chat/completions", data=body)
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", "Bearer " + KEY)
        try:
            with OPENER.open(request, timeout=600) as reply:
                return json.load(reply)["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 500, 502, 503) or attempt == 3:
                raise
        time.sleep(0.25 * 2**attempt)


def run(command):
    timeout = float(os.environ.get("HARBOR_COMMAND_TIMEOUT", "300"))
    try:
        done = subprocess.run([SHELL, "-c", command], capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"exit status: timeout after {timeout:.0f}s"
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    if len(output) > OUTPUT_CHARS:
        half = OUTPUT_CHARS // 2
        output = f"{output[:half]}\n[... {len(output) - OUTPUT_CHARS} characters elided ...]\n{output[-half:]}"
    return f"exit status: {done.returncode}\n{output}"


def main():
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sys.stdin.read()}]
    for turn in range(int(os.environ.get("HARBOR_MAX_TURNS", "20"))):
        try:
            message = complete(messages)
        except (OSError, ValueError, KeyError, IndexError) as exc:
            print(f"harness: the model failed: {exc}", file=sys.stderr)
            return 4
        message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            print(f"harness: done after {turn + 1} turns: {message.get('content') or ''}")
            return 0
        for call in calls:
            try:
                command = json.loads(call["function"]["arguments"])["command"]
                result = run(command) if call["function"]["name"] == "bash" else "error: the one tool is bash"
            except (ValueError, KeyError, TypeError):
                result = 'error: the arguments must be a JSON object {"command": "..."}'
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    print("harness: out of turns")
    return 3


if __name__ == "__main__":
    sys.exit(main())
