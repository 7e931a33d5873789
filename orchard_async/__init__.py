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
from .paths import check_output_file
from .pool import Pool
from .protocols import DEFAULT_EXEC_TIMEOUT, Adapter, GradedApart, Policy, Recipe, Sandbox, Session, Task
from .rollout import collect, plan, rollout
from .runtime import get_adapter, load_recipe, loop_choice, recipe_names, run
from .streams import SandboxStream, SandboxTransport, connect, forward
from .summary import Summary, percentile, summarize
from .task import Observation, Reward
from .trajectory import (
    Action,
    EndReason,
    Op,
    Retry,
    Step,
    Trajectory,
    TrajectoryWriter,
    check_trajectory_file,
    read_run_header,
    read_trajectories,
)
from .types import ExecResult, ExitReason, FileInfo, SandboxSpec

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EXEC_TIMEOUT",
    "Action",
    "Adapter",
    "AdapterUnavailable",
    "BackendUnavailable",
    "ConfigError",
    "ContextExhausted",
    "CreateFailed",
    "EndReason",
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
    "Recipe",
    "Retry",
    "Reward",
    "Sandbox",
    "SandboxLost",
    "SandboxSpec",
    "SandboxStream",
    "SandboxTransport",
    "Session",
    "Step",
    "Summary",
    "Task",
    "Trajectory",
    "TrajectoryWriter",
    "VerifierError",
    "check_output_file",
    "check_trajectory_file",
    "collect",
    "connect",
    "forward",
    "get_adapter",
    "load_recipe",
    "loop_choice",
    "percentile",
    "plan",
    "read_run_header",
    "read_trajectories",
    "recipe_names",
    "render",
    "rollout",
    "run",
    "summarize",
]
