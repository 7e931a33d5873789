"""Claw-Eval's ``task.yaml`` schema as msgspec Structs, mirroring its pydantic models
(``claw_eval.models.task``): the same fields and defaults, unknown keys refused where Claw-Eval
refuses them (a scoring check: ``extra="forbid"``) and ignored where it ignores them (everywhere
else: later versions add fields, e.g. ``environment.mock_today``).

Pydantic coerces a little where msgspec is strict, so the few fields real tasks write loosely take
both forms and are normalised on load: ``version: 3.0`` (a YAML float), a check's ``keywords: [2024]``
(numbers), a service's ``env`` values given as numbers.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Prompt(msgspec.Struct):
    text: str
    language: str = "zh"
    attachments: list[str] = msgspec.field(default_factory=list)


class DeterministicCheck(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    field: str | None = None
    tool_name: str | None = None
    min_calls: int | None = None
    categories: list[str] | None = None
    min_length: int | None = None
    patterns: list[str] | None = None
    keywords: list[str | int | float] | None = None
    description: str | None = None
    rubric: str | None = None

    def keyword_texts(self) -> list[str]:
        """Claw-Eval reads unquoted numbers among the keywords as text."""
        return [str(word) for word in self.keywords or []]


class ScoringComponent(msgspec.Struct):
    name: str
    weight: float
    check: DeterministicCheck


class SafetyCheck(msgspec.Struct):
    type: str
    tool_name: str | None = None
    patterns: list[str] | None = None
    description: str = ""


class Environment(msgspec.Struct):
    timeout_seconds: int = 300
    max_turns: int = 20
    fixtures: list[str] = msgspec.field(default_factory=list)
    env_snapshot_timeout: int = 10


class ServiceDef(msgspec.Struct):
    name: str
    command: str
    port: int
    health_check: str
    health_check_method: str = "POST"
    ready_timeout: int = 10
    reset_endpoint: str | None = None
    env: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)


class ExpectedAction(msgspec.Struct):
    service: str
    action_key: str
    required: bool = True


class UserAgentTaskConfig(msgspec.Struct):
    enabled: bool = False
    persona: str = ""
    max_rounds: int = 3
    system_prompt_suffix: str = ""


class ToolSpec(msgspec.Struct):
    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolEndpoint(msgspec.Struct):
    tool_name: str
    url: str
    method: str = "POST"


class TaskDefinition(msgspec.Struct):
    task_id: str
    task_name: str
    prompt: Prompt
    version: str | int | float = "1.0"
    category: str = ""
    difficulty: str = "simple"
    tools: list[ToolSpec] = msgspec.field(default_factory=list)
    tool_endpoints: list[ToolEndpoint] = msgspec.field(default_factory=list)
    environment: Environment = msgspec.field(default_factory=Environment)
    scoring_components: list[ScoringComponent] = msgspec.field(default_factory=list)
    safety_checks: list[SafetyCheck] = msgspec.field(default_factory=list)
    services: list[ServiceDef] = msgspec.field(default_factory=list)
    expected_actions: list[ExpectedAction] = msgspec.field(default_factory=list)
    judge_rubric: str = ""
    reference_solution: str = ""
    primary_dimensions: list[str] = msgspec.field(default_factory=list)
    tags: list[str] = msgspec.field(default_factory=list)
    user_agent: UserAgentTaskConfig = msgspec.field(default_factory=UserAgentTaskConfig)
    sandbox_files: list[str] = msgspec.field(default_factory=list)
    sandbox_grader_files: list[str] = msgspec.field(default_factory=list)
    env_snapshot_files: list[str] = msgspec.field(default_factory=list)
    env_snapshot_commands: list[str] = msgspec.field(default_factory=list)
    local_grader_files: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        self.version = str(self.version)
        for service in self.services:
            service.env = {key: str(value) for key, value in service.env.items()}


def parse(data: Any) -> TaskDefinition:
    """A task.yaml's content as a ``TaskDefinition``; ``msgspec.ValidationError`` names the field
    (``Object contains unknown field `foo` - at `$.scoring_components[0].check```)."""
    return msgspec.convert(data, TaskDefinition)
