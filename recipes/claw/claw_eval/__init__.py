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

from pathlib import Path

from orchard_async.recipes.claw.claw_eval.grading import claw_eval_importable, unsupported_checks
from orchard_async.recipes.claw.claw_eval.loader import Problem, inspect_folder

PREFIX = "claw-eval:"


def validate(source: str | Path, *, image: str = "") -> tuple[list[str], int]:
    """(one line per task: loads and runs, or why not; how many cannot run), running nothing."""
    from orchard_async.recipes.claw.task import ClawOptions

    tasks, problems = inspect_folder(Path(source).expanduser(), image=image or ClawOptions.from_env().image)
    grader = claw_eval_importable()
    lines = []
    for task in tasks:
        tools = len((task.claw_eval or {}).get("tools", []))
        services = ", ".join(s["name"] for s in (task.claw_eval or {}).get("services", []))
        has_grader = (task.task_dir / "grader.py").is_file()
        if grader:
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


__all__ = ["PREFIX", "Problem", "inspect_folder", "validate"]
