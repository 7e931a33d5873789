from dataclasses import dataclass, field
from typing import Any

from claw_eval.models.message import Message


@dataclass
class DimensionScores:
    completion: float = 0.0
    robustness: float = 0.0
    communication: float = 0.0
    safety: float = 1.0


@dataclass
class TraceMessage:
    trace_id: str
    message: Message


@dataclass
class ToolDispatch:
    trace_id: str
    tool_use_id: str
    tool_name: str
    endpoint_url: str
    request_body: dict = field(default_factory=dict)
    response_status: int = 200
    response_body: Any = None
