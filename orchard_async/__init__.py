"""orchard-async: isolated sandboxes for agent training and evaluation, from one asyncio process.

The public API. Everything not re-exported here is private.
"""

from orchard_async import _checkout  # noqa: F401 - a checkout's adapters, recipes and bench are its own
from orchard_async.capabilities import OFFLINE, ONLINE, EgressRule, NetworkConflict, NetworkPolicy, NetworkState
from orchard_async.engine.collector import tune_for_rollouts
from orchard_async.engine.episode import render
from orchard_async.engine.plan import Episode, plan
from orchard_async.engine.pool import Pool
from orchard_async.engine.processes import ProcessRollout, Workload
from orchard_async.engine.rollout import collect, rollout
from orchard_async.errors import (
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
from orchard_async.kit.labels import episode_label
from orchard_async.kit.streams import SandboxStream, SandboxTransport, connect, forward
from orchard_async.protocols import (
    DEFAULT_EXEC_TIMEOUT,
    Adapter,
    GradedApart,
    Policy,
    Recipe,
    Sandbox,
    Session,
    Task,
)
from orchard_async.records.paths import check_output_file
from orchard_async.records.summary import Summary, percentile, summarize
from orchard_async.records.trajectory import (
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
from orchard_async.runtime import (
    RecipeOptions,
    get_adapter,
    load_recipe,
    loop_choice,
    recipe_names,
    recipe_option,
    run,
)
from orchard_async.task import Observation, PhaseNetworks, Reward
from orchard_async.types import ExecResult, ExitReason, FileInfo, SandboxSpec

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EXEC_TIMEOUT",
    "OFFLINE",
    "ONLINE",
    "Action",
    "Adapter",
    "AdapterUnavailable",
    "BackendUnavailable",
    "ConfigError",
    "ContextExhausted",
    "CreateFailed",
    "EgressRule",
    "EndReason",
    "Episode",
    "ExecResult",
    "ExitReason",
    "FileInfo",
    "GradedApart",
    "InfraError",
    "ModelUnavailable",
    "NetworkConflict",
    "NetworkPolicy",
    "NetworkState",
    "Observation",
    "Op",
    "OrchardError",
    "PathOutsideSandbox",
    "PhaseNetworks",
    "Policy",
    "Pool",
    "ProcessRollout",
    "Recipe",
    "RecipeOptions",
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
    "Workload",
    "check_output_file",
    "check_trajectory_file",
    "collect",
    "connect",
    "episode_label",
    "forward",
    "get_adapter",
    "load_recipe",
    "loop_choice",
    "percentile",
    "plan",
    "read_run_header",
    "read_trajectories",
    "recipe_names",
    "recipe_option",
    "render",
    "rollout",
    "run",
    "summarize",
    "tune_for_rollouts",
]
