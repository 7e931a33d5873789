"""The part every bundled agent harness shares (stdlib only: it runs inside the sandbox, copied
next to the harness script, which imports it as ``harness_chat``): the model at
OPENAI_BASE_URL (the controller's recording proxy) with OPENAI_API_KEY and OPENAI_MODEL, and
the function-calling loop. A harness brings its own system prompt, tools, way of running the
model's tool calls and way of ending.

``run_agent``'s exit status: 0 done, 3 out of turns, 4 the model failed."""

import json
import os
import sys
import time
import urllib.error
import urllib.request

BASE = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ.get("OPENAI_API_KEY", "")
MODEL = os.environ.get("OPENAI_MODEL", "default")
# the proxy is on the sandbox's loopback: a proxy setting of the image must not carry the calls away
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ATTEMPTS = 4
TRANSIENT = (429, 500, 502, 503)  # statuses worth another attempt, after 0.25 s, 0.5 s, 1 s
BACKOFF = 0.25
KEPT = ("role", "content", "tool_calls")  # of a reply, what goes back into the history


def open_url(url, body=None, key=None):
    """A GET, or a POST of ``body`` as JSON; ``key`` as the bearer token."""
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", "Bearer " + key)
    return OPENER.open(request, timeout=600)


def read_stream(reply):
    """The assistant message out of server-sent chat.completion.chunk events."""
    message: dict = {"role": "assistant", "content": None}
    for raw in reply:
        line = raw.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        for choice in json.loads(line[5:]).get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                calls = message.setdefault("tool_calls", [])
                while len(calls) <= call.get("index", 0):
                    calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                entry = calls[call.get("index", 0)]
                entry["id"] = call.get("id") or entry["id"]
                entry["function"]["name"] += (call.get("function") or {}).get("name") or ""
                entry["function"]["arguments"] += (call.get("function") or {}).get("arguments") or ""
    return message


def complete(messages, tools, stream=False):
    """The model's next message; a transient status is tried again, up to ``ATTEMPTS`` calls."""
    body = {"model": MODEL, "messages": messages, "tools": tools, "stream": stream}
    for attempt in range(ATTEMPTS):
        try:
            with open_url(BASE + "/chat/completions", body, KEY) as reply:
                if stream:
                    return read_stream(reply)
                return json.load(reply)["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            if exc.code not in TRANSIENT or attempt == ATTEMPTS - 1:
                raise
        time.sleep(BACKOFF * 2**attempt)


def run_agent(system, tools, max_turns, run_calls, finish, stream=False):
    """The task from stdin, then up to ``max_turns`` model calls offering ``tools``: the
    ``tool_calls`` of each reply go to ``run_calls`` (calls -> one result text per call, in
    order); a reply without one ends the run with ``finish(message, turns)``. Returns the exit
    status."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": sys.stdin.read()}]
    for turn in range(max_turns):
        try:
            message = complete(messages, tools, stream)
        except (OSError, ValueError, KeyError, IndexError) as exc:
            print(f"harness: the model failed: {exc}", file=sys.stderr)
            return 4
        message = {k: v for k, v in message.items() if k in KEPT}
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            finish(message, turn + 1)
            return 0
        results = run_calls(calls)  # not zip(strict=True): the sandbox's python3 may be older than 3.10
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": results[i]} for i, c in enumerate(calls)]
    print("harness: out of turns")
    return 3
