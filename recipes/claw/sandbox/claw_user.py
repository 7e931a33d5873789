"""The simulated user as a language model, inside the sandbox (standard library only).

When the controller configures a user model, ``user.ask`` is answered by a model instead of
the task's script. The model is reached the way a harness reaches it: the controller's
recording proxy, relayed onto the sandbox's loopback (network stays off), with a session key
of the user's own; every call is recorded. The task's script still grounds it: its rules are
given to the model as the facts the user knows.

A model that cannot answer (unreachable, an HTTP error, no text) is recorded in the state as
``user.model_failure`` and the agent gets a 503: the controller then fails the episode as
``model_unavailable`` (an infrastructure failure), never as a reward.
"""

import json
import re
import urllib.error
import urllib.request

TIMEOUT = 45.0  # seconds per user turn: under the CLI's 60 s wait for any call
SYSTEM = """\
You play the user of a personal AI assistant that acts on your mail, calendar, files and other \
services. The assistant is doing a task for you and asks you a question. Stay in character and \
answer as this person would, briefly, in plain words; never do the assistant's work.

Who you are: {persona}
What you asked the assistant to do: {goal}
Facts you know (answer consistently with them, and invent nothing that contradicts them):
{facts}
When you have nothing to add, say something like: {default_reply}

Reply with one JSON object and nothing else: {{"reply": "<your answer>", "confirms": <true when \
your answer allows the assistant to go ahead with a permanent or sensitive action, else false>}}"""

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


class UserModelFailure(Exception):
    """The user model gave no answer."""


def messages_for(user, question, goal):
    facts = [
        "- when asked about {}: {}{}".format(
            " / ".join(rule.get("when", [])),
            rule.get("reply", ""),
            " (this gives your go-ahead)" if rule.get("confirms") else "",
        )
        for rule in user.get("script", [])
    ]
    system = SYSTEM.format(
        persona=user.get("persona") or "an ordinary user",
        goal=goal or "(not given)",
        facts="\n".join(facts) or "- none beyond the task",
        default_reply=user.get("default_reply") or "please go ahead as you see fit",
    )
    messages = [{"role": "system", "content": system}]
    for turn in user.get("asked", []):
        messages.append({"role": "user", "content": turn["question"]})
        messages.append(
            {"role": "assistant", "content": json.dumps({"reply": turn["reply"], "confirms": turn["confirms"]})}
        )
    messages.append({"role": "user", "content": question})
    return messages


def parse_reply(content):
    """(reply, confirms) out of the model's text: the JSON object asked for, or the text as is."""
    text = _FENCE.sub("", content.strip())
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("reply"), str) and data["reply"].strip():
        return data["reply"].strip(), data.get("confirms") is True
    return content.strip(), False


def complete(model, messages):
    """The model's text for ``messages`` (raises UserModelFailure)."""
    body = {"model": model.get("model") or "user", "messages": messages}
    request = urllib.request.Request(model["url"].rstrip("/") + "/chat/completions", data=json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", "Bearer " + model["key"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=float(model.get("timeout") or TIMEOUT)) as reply:
            data = json.loads(reply.read().decode())
    except urllib.error.HTTPError as exc:
        raise UserModelFailure(f"the user model answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise UserModelFailure(f"the user model cannot be reached: {exc}") from None
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise UserModelFailure("the user model's reply has no message") from None
    if not isinstance(content, str) or not content.strip():
        raise UserModelFailure("the user model's reply is empty")
    return content


def answer(user, question, model):
    """(reply, confirms) from the model, or raises UserModelFailure."""
    return parse_reply(complete(model, messages_for(user, question, model.get("goal", ""))))
