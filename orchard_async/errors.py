"""One error hierarchy. Every error a user can cause says what was wrong and what to do.

Two families matter to the rollout engine:

* ``InfraError`` (and its children) is the backend's fault: the episode is retried in a
  fresh sandbox, up to the configured limit.
* Everything else (bad input, a policy that raises, a task's own bug) is never retried.
"""

from __future__ import annotations


class OrchardError(Exception):
    """Base class of every error orchard-async raises on purpose."""


class ConfigError(OrchardError, ValueError):
    """Bad input from the caller: an invalid spec, an unknown adapter, a negative timeout."""


class PathOutsideSandbox(ConfigError):
    """A file operation named a path that resolves outside the sandbox."""


class AdapterUnavailable(OrchardError):
    """The backend cannot be used on this machine (library missing, daemon not running)."""


class InfraError(OrchardError):
    """The backend failed; the episode may be retried in a fresh sandbox."""


class CreateFailed(InfraError):
    """A sandbox could not be created."""


class SandboxLost(InfraError):
    """A sandbox died or stopped answering in the middle of an episode."""


class BackendUnavailable(InfraError):
    """The backend refused or timed out for a while (daemon down, API server throttling)."""


class VerifierError(InfraError):
    """The scorer could not judge the episode (test runner missing, test patch not applying,
    grader crashed or timed out). Never a reward: the episode is retried, then flagged."""


class ModelUnavailable(InfraError):
    """The model server could not answer (down, auth refused, retries exhausted). Never the
    policy's own failure and never training data."""


class ContextExhausted(OrchardError):
    """The policy cannot act any more (its model's context is full). Not a failure: the
    episode ends as ``context_exhausted`` and is scored on what the agent left."""
