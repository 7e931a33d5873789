"""The SWE recipe: coding-agent episodes on SWE-bench-style instances, rewarded by tests.

    orchard-async run swe --tasks builtin --policy oracle --episodes 48 --group-size 4 --out out/swe.jsonl

* tasks: ``load_tasks("builtin")`` (17 bundled offline instances), ``"builtin:minicalc__1,textkit"``
  (a subset by id or repo), or a ``.jsonl``/``.json`` file of SWE-bench-style instances;
* options (``SweOptions``: ``--recipe-options JSON`` or keywords of ``load_tasks``): limits,
  the images of SWE-bench instances, the grading harness; docs/variables.md lists them;
* policies: ``oracle`` (applies the gold patch with shell commands), ``empty`` (submits
  nothing), ``openai`` (a chat model over an OpenAI-compatible endpoint, configured from
  the environment: see ``openai_policy``);
* data out: ``export_sft`` and ``export_rl`` (see docs/training-formats.md); on the command
  line ``orchard-async export sft|rl|grpo`` (``cli.py``, this recipe's command) or
  ``python -m orchard_async.recipes.swe.export``.

Registered as the ``swe`` recipe and its ``export`` command through entry points (see
``orchard_async.Recipe``). Built only on the public core API, like every recipe. See
README.md in this folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_async import ConfigError, Policy
from orchard_async.recipes.swe.agent import SYSTEM_PROMPT, build_messages, parse_reply, truncate_middle
from orchard_async.recipes.swe.export import export_grpo, export_rl, export_sft
from orchard_async.recipes.swe.instances import Instance, load_instances
from orchard_async.recipes.swe.openai_policy import ChatClient, ModelConfig, ModelError, OpenAIPolicy
from orchard_async.recipes.swe.policies import EmptyPolicy, OraclePolicy
from orchard_async.recipes.swe.scoring import parse_test_outcomes
from orchard_async.recipes.swe.task import IMAGE, SweOptions, SWETask, load_tasks

IMAGES = [IMAGE]  # what `orchard-async images build` builds for this recipe
OPTIONS = SweOptions  # what `--recipe-options` takes

POLICIES = ("oracle", "empty", "openai")


def make_policy(name: str, options: SweOptions | Mapping[str, Any] | None = None, **keywords: Any) -> Policy:
    """The recipe's policies by name (``--policy``). None of them has an option of its own (they
    are checked all the same); ``openai``'s model settings are ``ModelConfig``'s, from the environment."""
    SweOptions.resolve(options, **keywords)
    if name == "oracle":
        return OraclePolicy()
    if name == "empty":
        return EmptyPolicy()
    if name == "openai":
        return OpenAIPolicy.from_env()
    raise ConfigError(f"unknown policy {name!r} for the swe recipe; choose one of: {', '.join(POLICIES)}")


__all__ = [
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
    "truncate_middle",
]
