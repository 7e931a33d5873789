"""Claw-Eval's own tasks, run unchanged: ``orchard-async run claw --tasks claw-eval:DIR``.

* ``schema``: Claw-Eval's ``task.yaml`` schema as msgspec Structs;
* ``loader``: task folders into Claw tasks, one line per folder that cannot run;
* ``sandbox/claw_eval_services.py``: its services (gmail, calendar, todo, contacts, kb, inventory,
  scheduler, notes) on their declared ports, inside the recipe's services server;
* ``grading``: its ``grader.py`` through its loader when ``claw_eval`` is importable, else the
  yaml's ``scoring_components`` and ``safety_checks``;
* ``validate``: what ``orchard-async claw validate DIR`` prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchard_async.recipes.claw.claw_eval.grading import unsupported_checks
from orchard_async.recipes.claw.claw_eval.loader import Problem, inspect_folder
from orchard_async.records.passk import pass_at_k, pass_hat_k

PREFIX = "claw-eval:"


def validate(source: str | Path, *, image: str = "") -> tuple[list[str], int]:
    """(one line per task: loads and runs, or why not; how many cannot run), running nothing."""
    from orchard_async.recipes.claw.task import ClawOptions

    tasks, problems = inspect_folder(Path(source).expanduser(), image=image or ClawOptions.from_env().image)
    lines = []
    for task in tasks:
        tools = len((task.claw_eval or {}).get("tools", []))
        services = ", ".join(s["name"] for s in (task.claw_eval or {}).get("services", []))
        has_grader = (task.task_dir / "grader.py").is_file()
        if task.claw_eval_grades:
            graded = "its grader.py (claw_eval)" if has_grader else "claw_eval's grader registry"
        else:
            graded = "scoring_components and safety_checks"
            missing = unsupported_checks(task.definition)
            if missing:
                graded += f" (cannot grade without claw_eval: {'; '.join(missing)}: a verifier error)"
        oracle = f", oracle.sh {len(task.oracle)} commands" if task.oracle else ""
        lines.append(f"{task.id}: loads, runs: services {services or '-'}, {tools} tools; graded by {graded}{oracle}")
    lines += [problem.line() for problem in problems]
    return lines, len(problems)


def report(trajectories: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """As Claw-Eval reports: per task, the mean completion, safety and robustness over its trials,
    and pass@k and pass^k for every k up to the number of trials (a trial passes when it succeeded;
    verifier errors and other unscored trials are left out)."""
    by_task: dict[str, list[Any]] = {}
    for trajectory in trajectories:
        info = trajectory.info or {}
        if trajectory.reward is None or "completion" not in info:
            continue
        by_task.setdefault(trajectory.task_id, []).append((trajectory, info))
    rows: dict[str, dict[str, Any]] = {}
    for task_id, trials in sorted(by_task.items()):
        n = len(trials)
        passed = sum(bool(t.success) for t, _ in trials)
        row: dict[str, Any] = {"trials": n, "passed": passed}
        for dimension in ("completion", "safety", "robustness"):
            row[dimension] = round(sum(float(info[dimension]) for _, info in trials) / n, 4)
        row["score"] = round(sum(float(t.reward) for t, _ in trials) / n, 4)
        for k in range(1, n + 1):
            row[f"pass@{k}"] = round(pass_at_k(n, passed, k), 4)
            row[f"pass^{k}"] = round(pass_hat_k(n, passed, k), 4)
        rows[task_id] = row
    return rows


def report_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """``report``'s rows as a table (``orchard-async claw report RUN.jsonl``)."""
    most = max((row["trials"] for row in rows.values()), default=1)
    ks = [f"pass@{k}" for k in range(1, most + 1)] + [f"pass^{k}" for k in range(1, most + 1)]
    header = ["task", "trials", "completion", "safety", "robustness", "score", *ks]
    table = [header]
    for task_id, row in rows.items():
        cells = [task_id, str(row["trials"])]
        cells += [f"{row[key]:.2f}" for key in ("completion", "safety", "robustness", "score")]
        cells += [f"{row[k]:.2f}" if k in row else "-" for k in ks]
        table.append(cells)
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip() for cells in table]


__all__ = ["PREFIX", "Problem", "inspect_folder", "report", "report_lines", "validate"]
