"""The GUI recipe: web agents in a headless Chromium, on web apps bundled with the package.

    orchard-async run gui --tasks builtin --policy oracle --episodes 16 --out out/gui.jsonl

* sites (``inside/sites``): a shop, a clinic's booking forms and a community wiki/forum,
  served by python3's standard library on the sandbox's loopback (its network stays off);
* the browser (``inside/browserd.py``): Debian's chromium, headless, started once per
  sandbox and driven over CDP from inside it; each step is one action, its output the next
  observation (feedback, URL, tabs, a screenshot stored by hash, the accessibility tree);
* tasks: ``load_tasks("builtin")`` (``tasks/builtin.jsonl``), ``"builtin:shop,forum-reply"``
  (a subset by site or id), a .jsonl file of the same schema (see ``task``), or a benchmark's
  file (``webvoyager:``, ``mind2web:``, ``deepshop:``; ``deepshop:builtin`` runs offline on
  the shop; see ``live``);
* observations: optionally with set-of-marks (the ``marks`` option, ``inside/marks.py``);
* options (``GuiOptions``: ``--recipe-options JSON`` or keywords of ``load_tasks`` and
  ``make_policy``): screenshots kept, set-of-marks, the model's addressing and screenshots,
  the chromium; docs/variables.md lists them;
* policies: ``oracle`` (scripted solutions), ``empty`` (answers nothing), ``openai`` (a
  multimodal chat model over an OpenAI-compatible endpoint: see ``openai_policy``), ``noisy-oracle:P``
  (the oracle with probability P, else empty).

Registered as the ``gui`` recipe through the ``orchard_async.recipes`` entry point; its
runs export as training data with ``orchard-async export`` (``export``: the chat with its
screenshots, ``--screenshots DIR``), or ``export-gui``, which takes GUI runs only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_async import ConfigError, Policy
from orchard_async.recipes import noisy_oracle
from orchard_async.recipes.gui.actions import ActionParseError, parse_text, tool_schemas
from orchard_async.recipes.gui.doctor import doctor
from orchard_async.recipes.gui.export import add_export_arguments, training_chats
from orchard_async.recipes.gui.lines import SITES
from orchard_async.recipes.gui.policies import EmptyPolicy, OraclePolicy
from orchard_async.recipes.gui.task import IMAGE, GuiOptions, GuiTask, load_tasks
from orchard_async.recipes.gui.tokens import automatic_action, parse_reply, token_chats  # --policy tokens

IMAGES = [IMAGE]  # what `orchard-async images build` builds for this recipe
OPTIONS = GuiOptions  # what `--recipe-options` takes

POLICIES = ("oracle", "empty", "openai", "noisy-oracle:P")
# What the adapter's sandboxes must do for this recipe (an adapter's facts, e.g. the sim adapter's
# runs_commands = False): `run` and `demo` refuse an adapter without them before the first sandbox.
ADAPTER_NEEDS = frozenset({"runs_commands"})


def make_policy(name: str, options: GuiOptions | Mapping[str, Any] | None = None, **keywords: Any) -> Policy:
    """The recipe's policies by name (``--policy``; ``noisy-oracle:P`` solves with probability P, see
    ``orchard_async.recipes``); ``openai`` takes its model from ``ModelConfig``
    (the environment) and the rest from the options."""
    opts = GuiOptions.resolve(options, **keywords)
    if name == "oracle":
        return OraclePolicy()
    noisy = noisy_oracle(name, OraclePolicy(), EmptyPolicy())  # solves with probability P, else the empty policy
    if noisy is not None:
        return noisy
    if name == "empty":
        return EmptyPolicy()
    if name == "openai":
        from orchard_async.models.client import ModelConfig
        from orchard_async.recipes.gui.openai_policy import GuiOpenAIPolicy

        return GuiOpenAIPolicy.from_options(opts, ModelConfig.from_env())
    raise ConfigError(f"unknown policy {name!r} for the gui recipe; choose one of: {', '.join(POLICIES)}")


__all__ = [
    "ADAPTER_NEEDS",
    "IMAGES",
    "OPTIONS",
    "POLICIES",
    "SITES",
    "add_export_arguments",
    "automatic_action",
    "parse_reply",
    "token_chats",
    "training_chats",
    "ActionParseError",
    "EmptyPolicy",
    "GuiOptions",
    "GuiTask",
    "OraclePolicy",
    "doctor",
    "load_tasks",
    "make_policy",
    "parse_text",
    "tool_schemas",
]
