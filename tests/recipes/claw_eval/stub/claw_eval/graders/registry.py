"""get_grader(task_id, tasks_dir=..., task_dir=...): the grader class in the task's grader.py."""

import importlib.util
import inspect
from pathlib import Path

from claw_eval.graders.base import AbstractGrader

LOADED = []  # (task_id, grader path): what the tests check


def get_grader(task_id, tasks_dir=None, task_dir=None):
    path = Path(task_dir or Path(tasks_dir) / task_id) / "grader.py"
    spec = importlib.util.spec_from_file_location(f"stub_grader_{task_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, AbstractGrader) and obj is not AbstractGrader:
            LOADED.append((task_id, str(path)))
            return obj()
    raise ValueError(f"no grader in {path}")
