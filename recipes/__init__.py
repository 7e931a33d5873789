"""The bundled recipes (swe, gui, claw, toy: each a plugin, see ``orchard_async.Recipe``) and
the one policy they share: ``noisy-oracle:P``.

A scripted policy that solves each episode with probability ``P`` (the recipe's oracle) and
otherwise fails (the recipe's empty policy), so that groups have variance without a model:
GRPO advantages, pass@k and the compare page can be seen and tested offline. The draw is
made once per episode from its id (and an optional seed, ``noisy-oracle:P:SEED``), never
from the clock: a rerun, a retried episode and a resumed run draw the same.
"""

from __future__ import annotations

import random

from orchard_async import Action, ConfigError, Observation, Policy
from orchard_async.protocols import tell_episode_ended

NOISY_ORACLE = "noisy-oracle"


class NoisyOracle:
    """The oracle with probability ``p`` per episode, else the failing policy."""

    def __init__(self, p: float, oracle: Policy, failing: Policy, seed: int = 0):
        self.p = p
        self.seed = seed
        self.oracle = oracle
        self.failing = failing
        self.name = f"{NOISY_ORACLE}:{p:g}" + (f":{seed}" if seed else "")

    def solves(self, episode_id: str) -> bool:
        return random.Random(f"{NOISY_ORACLE}/{self.seed}/{episode_id}").random() < self.p

    async def act(self, observation: Observation) -> Action:
        chosen = self.oracle if self.solves(observation.episode_id) else self.failing
        return await chosen.act(observation)

    def episode_ended(self, episode_id: str) -> None:
        tell_episode_ended(self.oracle, episode_id)
        tell_episode_ended(self.failing, episode_id)


def noisy_oracle(name: str, oracle: Policy, failing: Policy) -> NoisyOracle | None:
    """The policy ``name`` asks for when it is ``noisy-oracle:P[:SEED]`` (None for any other
    name); a P outside 0..1 or a seed that is not a whole number is a ConfigError."""
    kind, _, rest = name.partition(":")
    if kind != NOISY_ORACLE:
        return None
    text, _, seed_text = rest.partition(":")
    try:
        p = float(text)
    except ValueError:
        p = -1.0
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"--policy {name}: give the chance of solving, 0 to 1, as in noisy-oracle:0.5")
    try:
        seed = int(seed_text) if seed_text else 0
    except ValueError:
        raise ConfigError(f"--policy {name}: the seed after P must be a whole number (noisy-oracle:0.5:7)") from None
    return NoisyOracle(p, oracle, failing, seed)
