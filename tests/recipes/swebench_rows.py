"""Bundled instances as SWE-bench 5 dataset rows: the evaluation fields (``version``,
``eval_script``, ``log_parser``, ``eval_type``) written the way SWE-bench writes them for a
Python repository (swebench's ``make_eval_script_list_py``: activate the conda env, cd to
/testbed, reset the test files, apply the test patch from a here-document, the test
command between the output markers, reset again)."""

from __future__ import annotations

import json
from typing import Any

from orchard_async.recipes.swe.builtin import INSTANCES_PATH
from orchard_async.recipes.swe.instances import patch_files

BUILTIN = [json.loads(line) for line in INSTANCES_PATH.read_text().splitlines() if line.strip()]
HEREDOC = "EOF_114329324912"  # swebench's delimiter


def eval_script(row: dict[str, Any], *, conda: bool = True, global_git_config: bool = True) -> str:
    """``conda``: the activation lines (SWE-bench's images have /opt/miniconda3); off where
    there is none to source. ``global_git_config``: the ``git config --global`` line, off
    where it would write the developer's own ~/.gitconfig (the local adapter)."""
    base, test_patch = row["base_commit"], row["test_patch"]
    files = " ".join(patch_files(test_patch))
    activate = ["source /opt/miniconda3/bin/activate", "conda activate testbed"] if conda else []
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        *activate,
        "cd /testbed",
        *([("git config --global --add safe.directory /testbed")] if global_git_config else []),
        "cd /testbed",
        "git status",
        "git show",
        f"git -c core.fileMode=false diff {base}",
        *activate,
        f"git checkout {base} {files}",
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}",
        ": '>>>>> Start Test Output'",
        row["test_command"],
        ": '>>>>> End Test Output'",
        f"git checkout {base} {files}",
    ]
    return "\n".join(lines) + "\n"


def official_row(row: dict[str, Any], **script_options: bool) -> dict[str, Any]:
    """``row`` with SWE-bench's evaluation fields (its own ``test_command`` kept for the
    recipe's harness, which does not read them)."""
    return {
        **row,
        "version": "0.1",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "eval_script": eval_script(row, **script_options),
    }
