"""orchard-async: isolated sandboxes for agent training and evaluation, from one asyncio process.

The public API. Everything not re-exported here is private.
"""

from .episode import Episode, render
from .errors import (
    AdapterUnavailable,
    BackendUnavailable,
    ConfigError,
    ContextExhausted,
    CreateFailed,
    InfraError,
    ModelUnavailable,
    OrchardError,
    PathOutsideSandbox,
    SandboxLost,
    VerifierError,
)
from .pool import Pool
from .protocols import Adapter, Sandbox, Session
from .rollout import collect, plan, rollout
from .runtime import get_adapter, run
from .task import GradedApart, Observation, Policy, Reward, Task
from .trajectory import Action, Op, Retry, Step, Trajectory, TrajectoryWriter, read_trajectories
from .types import ExecResult, ExitReason, FileInfo, SandboxSpec

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Adapter",
    "AdapterUnavailable",
    "BackendUnavailable",
    "ConfigError",
    "ContextExhausted",
    "CreateFailed",
    "Episode",
    "ExecResult",
    "ExitReason",
    "FileInfo",
    "GradedApart",
    "InfraError",
    "ModelUnavailable",
    "Observation",
    "Op",
    "OrchardError",
    "PathOutsideSandbox",
    "Policy",
    "Pool",
    "Retry",
    "Reward",
    "Sandbox",
    "SandboxLost",
    "SandboxSpec",
    "Session",
    "Step",
    "Task",
    "Trajectory",
    "TrajectoryWriter",
    "VerifierError",
    "collect",
    "get_adapter",
    "plan",
    "read_trajectories",
    "render",
    "rollout",
    "run",
]
