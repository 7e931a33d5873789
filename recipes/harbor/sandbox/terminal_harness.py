"""A small terminal agent harness (stdlib only) that runs inside a Harbor task's sandbox: the
instruction on stdin, one function, ``bash``, whose command runs in the working directory
(HARBOR_COMMAND_TIMEOUT bounds it; the middle of a long output is elided); a reply without a
tool call ends the run. The model client and the loop are ``harness_chat``'s, copied next to
this file: HARBOR_MAX_TURNS bounds the model calls; the exit status is 0 when done, 3 out of
turns, 4 when the model failed."""

import json
import os
import shutil
import subprocess
import sys

import harness_chat

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
OUTPUT_CHARS = 10_000
SHELL = shutil.which("bash") or "/bin/sh"


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


def run_call(call):
    try:
        command = json.loads(call["function"]["arguments"])["command"]
        return run(command) if call["function"]["name"] == "bash" else "error: the one tool is bash"
    except (ValueError, KeyError, TypeError):
        return 'error: the arguments must be a JSON object {"command": "..."}'


def finish(message, turns):
    print(f"harness: done after {turns} turns: {message.get('content') or ''}")


def main():
    max_turns = int(os.environ.get("HARBOR_MAX_TURNS", "20"))
    return harness_chat.run_agent(SYSTEM, [BASH_TOOL], max_turns, lambda calls: [run_call(c) for c in calls], finish)


if __name__ == "__main__":
    sys.exit(main())
