"""The Claw recipe: personal-assistant agents over mock services (mail, calendar, contacts,
to-do, notes, documents, helpdesk, finance, chat, web search), in the spirit of Claw-Eval.

    orchard-async run claw --tasks builtin --policy oracle --episodes 40 --out out/claw.jsonl

* tasks: ``load_tasks("builtin")`` (the bundled YAML tasks), ``"builtin:ID,ID"``, a task file
  or a directory of them (schema in ``task``), or ``"claw-eval:DIR"``: Claw-Eval's own task folders,
  unchanged (``claw_eval``: its schema, services, graders; ``orchard-async claw validate DIR``);
* services: one stdlib-only server per sandbox, started at setup, reached through commands
  on the sandbox's PATH (``mail list --unread``) or HTTP on its loopback (``services``);
* scoring: from the services' audit and final state, read with a MAC the agent cannot forge
  (``grading``): ``safety x (0.8 completion + 0.2 robustness)``, passed at 0.75;
* options (``ClawOptions``: ``--recipe-options JSON`` or keywords of ``load_tasks`` and
  ``make_policy``): the sandbox image, the harness, the simulated user's model;
  docs/variables.md lists them;
* policies: ``oracle`` (each task's scripted solution), ``empty`` (does nothing), ``openai``
  (function calling over an OpenAI-compatible endpoint, see ``openai_policy``), ``harness``
  (an agent harness run inside the sandbox, its model calls recorded through a proxy, see ``harness``),
  ``noisy-oracle:P`` (the oracle with probability P, else empty);
* training data: ``orchard-async export sft|rl`` in this recipe's chat (``export.training_chats``);
* reports: ``pass_at_k`` and ``pass_hat_k`` per task group (``orchard_async.records.passk``, also in every run summary).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_async import ConfigError, Policy
from orchard_async.recipes import noisy_oracle
from orchard_async.recipes.claw.export import training_chats
from orchard_async.recipes.claw.grading import PASS_THRESHOLD, score
from orchard_async.recipes.claw.harness import MINI_SWE_AGENT_IMAGE
from orchard_async.recipes.claw.policies import EmptyPolicy, OraclePolicy
from orchard_async.recipes.claw.task import IMAGE, ClawOptions, ClawTask, load_task, load_tasks
from orchard_async.records.passk import pass_at_k, pass_hat_k, summarize_groups

IMAGES = [IMAGE, MINI_SWE_AGENT_IMAGE]  # what `orchard-async images build` builds for this recipe
OPTIONS = ClawOptions  # what `--recipe-options` takes

POLICIES = ("oracle", "empty", "openai", "harness", "noisy-oracle:P")
# What the adapter's sandboxes must do for this recipe (an adapter's facts, e.g. the sim adapter's
# runs_commands = False): `run` and `demo` refuse an adapter without them before the first sandbox.
ADAPTER_NEEDS = frozenset({"runs_commands"})


def make_policy(name: str, options: ClawOptions | Mapping[str, Any] | None = None, **keywords: Any) -> Policy:
    """The recipe's policies by name (``--policy``; ``noisy-oracle:P`` solves with probability P, see
    ``orchard_async.recipes``); ``openai`` and ``harness`` take their model
    from ``ModelConfig`` (the environment), ``harness`` its agent from the ``harness`` option."""
    opts = ClawOptions.resolve(options, **keywords)
    if name == "oracle":
        return OraclePolicy()
    noisy = noisy_oracle(name, OraclePolicy(), EmptyPolicy())  # solves with probability P, else the empty policy
    if noisy is not None:
        return noisy
    if name == "empty":
        return EmptyPolicy()
    if name == "openai":
        from orchard_async.recipes.claw.openai_policy import ToolCallingPolicy

        return ToolCallingPolicy.from_env()
    if name == "harness":
        from orchard_async.models.client import ModelConfig
        from orchard_async.recipes.claw.harness import HarnessPolicy

        return HarnessPolicy.from_options(opts, ModelConfig.from_env())
    raise ConfigError(f"unknown policy {name!r} for the claw recipe; choose one of: {', '.join(POLICIES)}")


__all__ = [
    "ADAPTER_NEEDS",
    "IMAGES",
    "OPTIONS",
    "PASS_THRESHOLD",
    "POLICIES",
    "ClawOptions",
    "ClawTask",
    "EmptyPolicy",
    "OraclePolicy",
    "load_task",
    "load_tasks",
    "make_policy",
    "pass_at_k",
    "pass_hat_k",
    "score",
    "summarize_groups",
    "training_chats",
]
