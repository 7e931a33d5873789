"""The SWE recipe: coding-agent episodes on SWE-bench-style instances, rewarded by tests.

    orchard-async run swe --tasks builtin --policy oracle --episodes 48 --group-size 4 --out out/swe.jsonl

* tasks: ``load_tasks("builtin")`` (17 bundled offline instances), ``"builtin:minicalc__1,textkit"``
  (a subset by id or repo), or a ``.jsonl``/``.json`` file of SWE-bench-style instances;
* options (``SweOptions``: ``--recipe-options JSON`` or keywords of ``load_tasks``): limits,
  the images of SWE-bench instances, the grading harness; docs/variables.md lists them;
* policies: ``oracle`` (applies the gold patch with shell commands), ``empty`` (submits
  nothing), ``openai`` (a chat model over an OpenAI-compatible endpoint, configured from
  the environment: see ``openai_policy``), ``noisy-oracle:P`` (the oracle with probability P,
  else empty);
* data out: ``export_sft`` and ``export_rl`` (see docs/training-formats.md); on the command
  line ``orchard-async export sft|rl|grpo`` (the chat: ``training_chats``) or
  ``python -m orchard_async.recipes.swe.export``.

Registered as the ``swe`` recipe through an entry point (see ``orchard_async.Recipe``). Built only on the public core API, like every recipe. See
README.md in this folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_async import ConfigError, Policy
from orchard_async.recipes import noisy_oracle
from orchard_async.recipes.swe.agent import SYSTEM_PROMPT, build_messages, parse_reply, truncate_middle
from orchard_async.recipes.swe.export import export_grpo, export_rl, export_sft, training_chats
from orchard_async.recipes.swe.instances import Instance, load_instances
from orchard_async.recipes.swe.openai_policy import ChatClient, ModelConfig, ModelError, OpenAIPolicy
from orchard_async.recipes.swe.policies import EmptyPolicy, OraclePolicy
from orchard_async.recipes.swe.scoring import parse_test_outcomes
from orchard_async.recipes.swe.task import IMAGE, SweOptions, SWETask, load_tasks

IMAGES = [IMAGE]  # what `orchard-async images build` builds for this recipe
OPTIONS = SweOptions  # what `--recipe-options` takes

POLICIES = ("oracle", "empty", "openai", "noisy-oracle:P")
# What the adapter's sandboxes must do for this recipe (an adapter's facts, e.g. the sim adapter's
# runs_commands = False): `run` and `demo` refuse an adapter without them before the first sandbox.
ADAPTER_NEEDS = frozenset({"runs_commands"})


def make_policy(name: str, options: SweOptions | Mapping[str, Any] | None = None, **keywords: Any) -> Policy:
    """The recipe's policies by name (``--policy``; ``noisy-oracle:P`` solves with probability P, see
    ``orchard_async.recipes``). None of them has an option of its own (they
    are checked all the same); ``openai``'s model settings are ``ModelConfig``'s, from the environment."""
    SweOptions.resolve(options, **keywords)
    if name == "oracle":
        return OraclePolicy()
    noisy = noisy_oracle(name, OraclePolicy(), EmptyPolicy())  # solves with probability P, else the empty policy
    if noisy is not None:
        return noisy
    if name == "empty":
        return EmptyPolicy()
    if name == "openai":
        return OpenAIPolicy.from_env()
    raise ConfigError(f"unknown policy {name!r} for the swe recipe; choose one of: {', '.join(POLICIES)}")


__all__ = [
    "ADAPTER_NEEDS",
    "IMAGES",
    "OPTIONS",
    "POLICIES",
    "SYSTEM_PROMPT",
    "ChatClient",
    "EmptyPolicy",
    "Instance",
    "ModelConfig",
    "ModelError",
    "OpenAIPolicy",
    "OraclePolicy",
    "SWETask",
    "SweOptions",
    "build_messages",
    "export_grpo",
    "export_rl",
    "export_sft",
    "load_instances",
    "load_tasks",
    "make_policy",
    "parse_reply",
    "parse_test_outcomes",
    "training_chats",
    "truncate_middle",
]
