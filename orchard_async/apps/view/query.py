"""What the page asks of an indexed run: the summary, a filtered and sorted page of the
episodes table, one episode in full, a group side by side, and two runs per task.

Filters and sorting run over the index's columns; only the rows shown are decoded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from orchard_async.apps.view.index import FINISHED, SUCCESS, VERIFIER_ERROR, RunIndex, histogram
from orchard_async.errors import ConfigError
from orchard_async.records.summary import to_json
from orchard_async.records.trajectory import Trajectory

PAGE_LIMIT = 500  # rows one request may ask for
GROUP_LIMIT = 256  # samples a group view shows
FACET_LIMIT = 2000  # distinct values a filter's list offers (beyond that: type to match)
EPSILON = 1e-6  # as the SWE export's std advantage
SORT_KEYS = ("file", "reward", "time", "steps", "retries")
PHASES = ("create", "setup", "agent", "exec", "score", "destroy")
GUI_CLIENT = ".gui/act "
_SCREENSHOT_LINE = re.compile(r"screenshot: sha256=([0-9a-f]{64})(?: (\d+)x(\d+))?")
# A set-of-marks line of a GUI observation's header: [id] role "name" x,y,w,h
_MARK_LINE = re.compile(r'^\[(\d+)\] (\S+)(?: "(?:[^"\\]|\\.)*")? (-?\d+),(-?\d+),(\d+),(\d+)$')


class Filters(msgspec.Struct, kw_only=True):
    """The episodes table's filters, from the query string (every one optional)."""

    task: str = ""  # part of the task id (case-insensitive)
    group: str = ""  # the exact group id
    policy: str = ""
    end: str = ""  # the exact end reason
    status: str = ""  # finished | failed
    success: str = ""  # yes | no
    min_reward: float | None = None
    max_reward: float | None = None
    verifier: bool = False  # only episodes a verifier error touched (its end, or a retried attempt)
    retries: bool = False  # only episodes that were retried
    sort: str = "file"
    order: str = "asc"
    offset: int = 0
    limit: int = 50

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Filters:
        def number(name: str) -> float | None:
            text = query.get(name, "").strip()
            if not text:
                return None
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {text!r}") from None
            if math.isnan(value):
                raise ConfigError(f"{name} must be a number, got {text!r}")
            return value

        def whole(name: str, default: int) -> int:
            text = query.get(name, "").strip()
            if not text:
                return default
            if not text.isdigit():
                raise ConfigError(f"{name} must be a whole number, got {text!r}")
            return int(text)

        filters = cls(
            task=query.get("task", "").strip(),
            group=query.get("group", ""),
            policy=query.get("policy", ""),
            end=query.get("end", ""),
            status=query.get("status", ""),
            success=query.get("success", ""),
            min_reward=number("min_reward"),
            max_reward=number("max_reward"),
            verifier=query.get("verifier", "") in ("1", "true", "yes"),
            retries=query.get("retries", "") in ("1", "true", "yes"),
            sort=query.get("sort", "file") or "file",
            order=query.get("order", "asc") or "asc",
            offset=whole("offset", 0),
            limit=min(PAGE_LIMIT, max(1, whole("limit", 50))),
        )
        if filters.sort not in SORT_KEYS:
            raise ConfigError(f"sort must be one of {', '.join(SORT_KEYS)}, got {filters.sort!r}")
        if filters.order not in ("asc", "desc"):
            raise ConfigError(f"order must be asc or desc, got {filters.order!r}")
        if filters.status not in ("", "finished", "failed") or filters.success not in ("", "yes", "no"):
            raise ConfigError("status must be finished or failed; success yes or no")
        return filters


def summary_of(index: RunIndex) -> dict[str, Any]:
    """``inspect --json``'s object, and what the page draws besides: histograms, facets.
    ``pending`` while pass@k and pass^k are still being computed (they are empty until then)."""
    assert index.summary is not None
    summary = msgspec.json.decode(to_json(index.summary))
    return {
        "pending": not index.summary_complete,
        "path": str(index.path),
        "header": index.header,
        "warnings": index.warnings,
        "summary": summary,
        "phases": [phase for phase in PHASES if phase in summary["time_share"]]
        + [phase for phase in summary["time_share"] if phase not in PHASES],
        "reward_histogram": histogram(index.rewards),
        "time_histogram": histogram(index.durations, discrete=False),
        "facets": {
            "tasks": index.tasks.values[:FACET_LIMIT],
            "task_count": len(index.tasks.values),
            "policies": index.policies.values[:FACET_LIMIT],
            "end_reasons": index.end_reasons.values[:FACET_LIMIT],
            "groups": len(index.groups.values),
        },
    }


def matching_rows(index: RunIndex, filters: Filters) -> list[int]:
    """Rows that pass every filter, in the requested order."""
    rows: range | list[int] = range(len(index))
    if filters.task:
        needle = filters.task.lower()
        tasks = {n for n, task in enumerate(index.tasks.values) if needle in task.lower()}
        rows = [row for row in rows if index.task_of[row] in tasks]
    for value, column, table in (
        (filters.group, index.group_of, index.groups),
        (filters.policy, index.policy_of, index.policies),
        (filters.end, index.end_of, index.end_reasons),
    ):
        if value:
            number = table.find(value)
            rows = [] if number is None else [row for row in rows if column[row] == number]
    if filters.status:
        finished = filters.status == "finished"
        rows = [row for row in rows if bool(index.flags[row] & FINISHED) == finished]
    if filters.success:
        succeeded = filters.success == "yes"
        rows = [row for row in rows if bool(index.flags[row] & SUCCESS) == succeeded]
    if filters.min_reward is not None:
        rows = [row for row in rows if index.rewards[row] >= filters.min_reward]
    if filters.max_reward is not None:
        rows = [row for row in rows if index.rewards[row] <= filters.max_reward]
    if filters.verifier:
        rows = [row for row in rows if index.flags[row] & VERIFIER_ERROR]
    if filters.retries:
        rows = [row for row in rows if index.retry_counts[row] > 0]
    rows = list(rows)
    column = {
        "reward": index.rewards,
        "time": index.durations,
        "steps": index.step_counts,
        "retries": index.retry_counts,
    }.get(filters.sort)
    descending = filters.order == "desc"
    if column is not None:
        rows.sort(key=column.__getitem__, reverse=descending)  # stable: ties keep file order
    elif descending:
        rows.reverse()
    return rows


def table_row(row: int, trajectory: Trajectory) -> dict[str, Any]:
    return {
        "row": row,
        "episode_id": trajectory.episode_id,
        "task_id": trajectory.task_id,
        "group_id": trajectory.group_id,
        "sample": trajectory.sample,
        "policy": trajectory.policy,
        "status": trajectory.status,
        "end_reason": str(trajectory.end_reason),
        "reward": trajectory.reward,
        "success": trajectory.success,
        "steps": len(trajectory.steps),
        "retries": len(trajectory.retries),
        "time_s": trajectory.timings.get("total"),
    }


def episodes_page(index: RunIndex, filters: Filters) -> dict[str, Any]:
    rows = matching_rows(index, filters)
    shown = rows[filters.offset : filters.offset + filters.limit]
    return {
        "total": len(rows),
        "offset": filters.offset,
        "limit": filters.limit,
        "rows": [table_row(row, t) for row, t in zip(shown, index.trajectories(shown), strict=True)],
    }


def screenshot_of(observation: str) -> dict[str, Any] | None:
    """The screenshot a GUI step's observation names (``screenshot: sha256=HEX WxH ...``)."""
    match = _SCREENSHOT_LINE.search(observation)
    if match is None:
        return None
    width, height = match.group(2), match.group(3)
    shot: dict[str, Any] = {
        "sha256": match.group(1),
        "width": int(width) if width else None,
        "height": int(height) if height else None,
    }
    marks = marks_of(observation)
    if marks:
        shot["marks"] = marks
    return shot


def marks_of(observation: str) -> list[dict[str, Any]]:
    """The set-of-marks boxes a GUI observation lists (``marks: N`` then ``[id] role "name"
    x,y,w,h`` lines, before the tree), so the page can draw the box an action named."""
    header, _, _ = observation.partition("\n---\n")
    _, found, listed = header.partition("\nmarks: ")
    if not found:
        return []
    marks = []
    for line in listed.splitlines()[1:]:
        match = _MARK_LINE.match(line)
        if match:
            element, role, *box = match.groups()
            marks.append({"element": element, "role": role, "box": [int(value) for value in box]})
    return marks


def gui_action_of(command: str) -> dict[str, Any] | None:
    """The GUI action a step ran (``.gui/act '<json>'``), to draw on the screenshot it led from."""
    if not command.startswith(GUI_CLIENT):
        return None
    text = command[len(GUI_CLIENT) :].strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1].replace("'\"'\"'", "'")  # shlex.quote's way of quoting a quote
    try:
        action = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return action if isinstance(action, dict) else None


def tool_calls_of(raw: str) -> list[Any] | None:
    """Tool calls in a model reply recorded as JSON (function calling: ``{"tool_calls": [...]}``)."""
    if not raw.lstrip().startswith("{"):
        return None
    try:
        message = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return calls if isinstance(calls, list) and calls else None


def episode_detail(index: RunIndex, row: int, screenshot_exists: Any) -> dict[str, Any]:
    """One episode in full, with what the page draws from it: each step's GUI action and
    screenshot (when the file is in the run's folder), tool calls, and the group's stats."""
    if not 0 <= row < len(index):
        raise KeyError(row)
    trajectory = index.trajectory(row)
    data = msgspec.to_builtins(trajectory)
    previous_shot: dict[str, Any] | None = None
    for step, source in zip(data["steps"], trajectory.steps, strict=True):
        # The action of step i was taken looking at the screenshot of the observation before it.
        step["gui_action"] = gui_action_of(source.action.command)
        step["acted_on"] = previous_shot
        shot = screenshot_of(source.observation)
        if shot is not None:
            shot["available"] = bool(screenshot_exists(shot["sha256"]))
        step["screenshot"] = shot
        step["tool_calls"] = tool_calls_of(source.action.raw)
        previous_shot = shot or previous_shot
    first_shot = screenshot_of(trajectory.instruction)
    if first_shot is not None:
        first_shot["available"] = bool(screenshot_exists(first_shot["sha256"]))
        if data["steps"] and data["steps"][0]["acted_on"] is None:
            data["steps"][0]["acted_on"] = first_shot
    data["instruction_screenshot"] = first_shot
    data["row"] = row
    data["run_id"] = trajectory.run_id
    return data


def group_view(index: RunIndex, group_id: str) -> dict[str, Any]:
    """A group's samples side by side, with their advantages within the group (reward minus
    the mean of the group's scored samples; divided by std + 1e-6 too, as GRPO does)."""
    number = index.groups.find(group_id)
    if number is None:
        raise KeyError(group_id)
    rows = [row for row in range(len(index)) if index.group_of[row] == number][:GROUP_LIMIT]
    trajectories = index.trajectories(rows)
    scored = [t.reward for t in trajectories if t.status == "finished"]
    mean = sum(scored) / len(scored) if scored else math.nan
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored)) if scored else math.nan
    samples = []
    for row, trajectory in zip(rows, trajectories, strict=True):
        sample = table_row(row, trajectory)
        if trajectory.status == "finished":
            sample["advantage"] = trajectory.reward - mean
            sample["advantage_std"] = (trajectory.reward - mean) / (std + EPSILON)
        else:
            sample["advantage"] = sample["advantage_std"] = None  # not scored: no advantage
        last = trajectory.steps[-1] if trajectory.steps else None
        sample["last_action"] = (last.action.command or last.action.kind)[:300] if last else ""
        sample["patch"] = str(trajectory.info.get("patch", ""))[:4000]
        samples.append(sample)
    return {
        "group_id": group_id,
        "task_id": trajectories[0].task_id if trajectories else "",
        "instruction": trajectories[0].instruction[:4000] if trajectories else "",
        "scored": len(scored),
        "mean": None if math.isnan(mean) else mean,
        "std": None if math.isnan(std) else std,
        "samples": samples,
    }


def per_task(index: RunIndex) -> dict[str, dict[str, float]]:
    """Per task id: episodes, mean reward, success rate, mean episode time."""
    sums: dict[int, list[float]] = {}
    for row in range(len(index)):
        entry = sums.setdefault(index.task_of[row], [0, 0.0, 0, 0.0])
        entry[0] += 1
        entry[1] += index.rewards[row]
        entry[2] += bool(index.flags[row] & SUCCESS)
        entry[3] += index.durations[row]
    return {
        index.tasks.values[number]: {
            "episodes": n,
            "mean_reward": reward / n,
            "success_rate": successes / n,
            "mean_time_s": time / n,
        }
        for number, (n, reward, successes, time) in sums.items()
    }


def compare_runs(indexes: list[RunIndex]) -> dict[str, Any]:
    """Each task's reward and time in every run, and the change from the first run."""
    tables = [per_task(index) for index in indexes]
    tasks: list[str] = []
    seen: set[str] = set()
    for table in tables:
        for task in table:
            if task not in seen:
                seen.add(task)
                tasks.append(task)
    rows = []
    for task in tasks:
        cells = [table.get(task) for table in tables]
        base, other = cells[0], cells[-1]
        rows.append(
            {
                "task_id": task,
                "runs": cells,
                "reward_delta": other["mean_reward"] - base["mean_reward"] if base and other else None,
                "time_delta_s": other["mean_time_s"] - base["mean_time_s"] if base and other else None,
            }
        )
    return {"runs": [str(index.path) for index in indexes], "tasks": rows}
