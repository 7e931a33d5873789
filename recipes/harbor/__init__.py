"""The Harbor recipe: Harbor / Terminal-Bench task folders, run unchanged.

    orchard-async run harbor --tasks DATASET_DIR --policy oracle --adapter docker --out out/harbor.jsonl

* tasks: ``--tasks DIR``, a dataset folder of task folders or one task folder, in Harbor's
  layout (``instruction.md``, ``task.toml``, ``environment/``, ``tests/test.sh``,
  ``solution/solve.sh``; see ``config``); a folder that cannot run is one warning line and
  the rest run; ``orchard-async harbor validate DIR`` says per task whether it loads and
  runs, and why not;
* images: the task's ``docker_image``, or its ``environment/Dockerfile`` built here by
  ``orchard-async harbor build DIR`` (no registry: ``image_map`` maps the bases; see
  ``images``); on local the Dockerfile's steps are replayed in the sandbox;
* scoring: Harbor's verifier, unforgeable (``task``): ``shared`` ends the agent's processes
  and restores ``/tests`` and ``/logs/verifier``; ``separate`` grades apart in a fresh
  sandbox with only the artifacts; the reward as Harbor reads it, a multi-metric
  ``reward.json`` kept whole in the trajectory's ``info["rewards"]``;
* options (``HarborOptions``): ``image_map``, ``ids``, ``max_steps``, ``exec_timeout``,
  ``agent_timeout``, ``pass_threshold``;
* policies: ``oracle`` (``solution/solve.sh`` as Harbor's oracle agent runs it), ``empty``,
  ``openai`` (a terminal agent, ``openai_policy``), ``harness`` (a CLI agent inside the
  sandbox, its model calls recorded through a proxy, ``harness``), ``noisy-oracle:P``; each
  runs once per step of a multi-step task (``steps.Stepwise``).

The other way round, ``orchard_async.harbor`` makes any orchard-async adapter a Harbor
environment (``harbor run -e orchard_async.harbor:OrchardEnvironment``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_async import ConfigError, Policy
from orchard_async.recipes import noisy_oracle
from orchard_async.recipes.harbor.config import TaskConfig, parse_config, parse_rewards
from orchard_async.recipes.harbor.policies import EmptyPolicy, OraclePolicy
from orchard_async.recipes.harbor.steps import Stepwise
from orchard_async.recipes.harbor.task import HarborOptions, HarborTask, SeparateHarborTask, load_task, load_tasks

OPTIONS = HarborOptions  # what `--recipe-options` takes
POLICIES = ("oracle", "empty", "openai", "harness", "noisy-oracle:P")
# What the adapter's sandboxes must do for this recipe: `run` and `demo` refuse an adapter without it.
ADAPTER_NEEDS = frozenset({"runs_commands"})


def make_policy(name: str, options: HarborOptions | Mapping[str, Any] | None = None, **keywords: Any) -> Policy:
    """The recipe's policies by name (``--policy``), each run once per step of a multi-step
    task (``Stepwise``); ``openai`` and ``harness`` take their model from ``ModelConfig`` (the
    environment), ``harness`` its agent from the ``harness`` option."""
    opts = HarborOptions.resolve(options, **keywords)
    policy = _policy(name, opts)
    if policy is None:
        raise ConfigError(f"unknown policy {name!r} for the harbor recipe; choose one of: {', '.join(POLICIES)}")
    return Stepwise(policy)


def _policy(name: str, opts: HarborOptions) -> Policy | None:
    if name == "oracle":
        return OraclePolicy()
    noisy = noisy_oracle(name, OraclePolicy(), EmptyPolicy())
    if noisy is not None:
        return noisy
    if name == "empty":
        return EmptyPolicy()
    if name == "openai":
        from orchard_async.recipes.harbor.openai_policy import TerminalAgent

        return TerminalAgent.from_env()
    if name == "harness":
        from orchard_async.models.client import ModelConfig
        from orchard_async.recipes.harbor.harness import HarnessPolicy

        return HarnessPolicy.from_options(opts, ModelConfig.from_env())
    return None


__all__ = [
    "ADAPTER_NEEDS",
    "OPTIONS",
    "POLICIES",
    "EmptyPolicy",
    "HarborOptions",
    "HarborTask",
    "OraclePolicy",
    "SeparateHarborTask",
    "Stepwise",
    "TaskConfig",
    "load_task",
    "load_tasks",
    "make_policy",
    "parse_config",
    "parse_rewards",
]
