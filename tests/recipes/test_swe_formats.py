"""The SWE datasets' own formats load as published (recipes/swe/formats.py), without a
container: each format's row (tests/recipes/swe_format_rows.py) is detected and read to
what decides where its repository is, how it is entered, what runs its tests and what
reads their log; a Parquet export loads to the same instances; bad rows are one line; `swe
validate` says per row what it found. Running them on docker: test_swe_formats_docker.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe import cli as swe_cli
from orchard_async.recipes.swe import formats, scoring
from orchard_async.recipes.swe.instances import load_instances
from tests.recipes import swe_format_rows as rows


def write(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, tuple[dict, str, Path]]:
    """Each format's row, its image's name, and the folder of its dataset file."""
    out = {}
    for name, build in (
        (formats.REBENCH, rows.rebench),
        (formats.SCALE, rows.scale),
        (formats.SMITH, rows.smith),
        (formats.SWE_BENCH, rows.multilingual),
    ):
        folder = tmp_path_factory.mktemp(name)
        row, image = build(folder / "context")
        out[name] = (row, image, folder)
    folder = tmp_path_factory.mktemp("pro")
    row, image = rows.pro(folder / "context", folder / "run_scripts")
    out[formats.PRO] = (row, image, folder)
    return out


@pytest.mark.parametrize("name", [formats.REBENCH, formats.SCALE, formats.SMITH, formats.PRO, formats.SWE_BENCH])
def test_each_format_is_detected_and_by_its_prefix(made, name):
    row, image, folder = made[name]
    path = write(folder / "rows.jsonl", [row])
    (detected,) = load_instances(path)
    (named,) = swe.load_tasks(f"{name}:{path}")
    assert detected.format == named.instance.format == name
    assert named.spec.image == image
    assert detected.extra.keys() >= {k for k in row if k not in ("instance_id", "repo", "base_commit", "patch")} - {
        "problem_statement",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "image",
        "test_command",
        "activate",
    }


def test_swe_rebench_v2_reads_install_config_and_its_workdir(made):
    row, image, folder = made[formats.REBENCH]
    (task,) = swe.load_tasks(str(write(folder / "r.jsonl", [row])))
    assert task.spec.workdir == "/minicalc"  # its images' WORKDIR: the repository's name
    harness = task.harness
    assert isinstance(harness, scoring.LogParserTests)
    assert (harness.test_command, harness.parser) == (row["install_config"]["test_cmd"], "parse_log_pytest")
    assert task.instance.problem_statement == row["problem_statement"]
    assert task.instance.extra["install_config"]["install"] == ["pip install -e ."]  # kept, not run


def test_scale_swe_adds_its_f2p_script_for_grading_and_enters_with_pre_commands(made):
    row, image, folder = made[formats.SCALE]
    (task,) = swe.load_tasks(str(write(folder / "s.jsonl", [row])))
    inst = task.instance
    assert (task.spec.workdir, inst.base_commit, inst.repo) == (
        "/data/minicalc",
        row["parent_commit"],
        "orchard/minicalc",
    )
    assert inst.enter_commands == (row["pre_commands"],)
    assert formats.SCALE_F2P_SCRIPT in inst.test_files and inst.test_patch.startswith(row["f2p_patch"])
    assert isinstance(task.harness, scoring.PytestHarness)
    assert formats.SCALE_F2P_SCRIPT in task.test_command


def test_swe_smith_is_a_branch_whose_fix_is_the_bug_reversed(made):
    row, image, folder = made[formats.SMITH]
    (task,) = swe.load_tasks(str(write(folder / "m.jsonl", [row])))
    inst = task.instance
    assert inst.base_commit == row["instance_id"] and inst.gold_reverse and inst.test_patch == ""
    assert (
        task.spec.workdir == "/testbed" and "conda activate testbed" in task.activation.prefix and task.activation.env
    )
    assert isinstance(task.harness, scoring.LogParserTests)
    assert task.test_command.startswith(formats.SMITH_TEST_COMMAND) and "tests/test_evaluator.py" in task.test_command
    without_image = {k: v for k, v in row.items() if k != "image_name"}
    (by_convention,) = load_instances(write(folder / "n.jsonl", [without_image]))
    assert by_convention.image == formats.smith_image_name(row["repo"])
    assert by_convention.image.startswith("jyangballin/swesmith.x86_64.orchard_1776_minicalc.")


def test_swe_bench_pro_grades_with_its_scripts_and_shows_requirements(made):
    row, image, folder = made[formats.PRO]
    (task,) = swe.load_tasks(str(write(folder / "p.jsonl", [row])))
    inst = task.instance
    assert task.spec.workdir == "/app" and image == f"jefzda/sweap-images:{row['dockerhub_tag']}"
    assert isinstance(task.harness, scoring.ProTests)
    assert (
        inst.pro.test_files == tuple(rows.TEST_FILES) and inst.test_stage == row["before_repo_set_cmd"].splitlines()[-1]
    )
    assert inst.FAIL_TO_PASS == tuple(rows.F2P)  # Python list literals, as Pro stores them
    assert inst.problem_statement.startswith(row["problem_statement"].rstrip())
    assert "Requirements:\n" + row["requirements"] in inst.problem_statement
    assert scoring.passing_of(inst) == {"PASSED"}


def test_a_parquet_export_loads_to_the_same_instances(made, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pip install -e '.[dev]'")
    import pyarrow

    row, image, folder = made[formats.REBENCH]
    flat = {**row, "install_config": json.dumps(row["install_config"]), "meta": json.dumps(row["meta"])}
    pq.write_table(pyarrow.Table.from_pylist([flat]), tmp_path / "train-00000-of-00001.parquet")
    (from_parquet,) = load_instances(tmp_path / "train-00000-of-00001.parquet")
    (from_jsonl,) = load_instances(write(tmp_path / "r.jsonl", [row]))
    for field in ("instance_id", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image"):
        assert getattr(from_parquet, field) == getattr(from_jsonl, field)
    assert from_parquet.log_parser == from_jsonl.log_parser


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: {k: v for k, v in r.items() if k != "install_config"} | {"install_config": {"test_cmd": "x"}},
            "field 'install_config' needs a non-empty string 'log_parser'",
        ),
        (lambda r: {"instance_id": "odd", "title": "no format"}, "missing required fields 'repo', 'base_commit'"),
    ],
)
def test_bad_rows_are_one_line(made, tmp_path, change, message):
    row, image, folder = made[formats.REBENCH]
    with pytest.raises(oa.ConfigError, match=message) as caught:
        load_instances(write(tmp_path / "bad.jsonl", [change(row)]))
    assert "\n" not in str(caught.value)


def test_pro_without_its_scripts_names_the_missing_file(made, tmp_path):
    row, image, folder = made[formats.PRO]
    with pytest.raises(
        oa.ConfigError, match=r"SWE-bench Pro's run_script.sh for this instance is missing: .*run_scripts/"
    ):
        load_instances(write(tmp_path / "p.jsonl", [row]))


def test_validate_says_per_row_what_it_found(made, tmp_path, capsys):
    good, image, folder = made[formats.REBENCH]
    path = write(folder / "v.jsonl", [good, {"instance_id": "broken"}])
    parser = argparse.ArgumentParser()
    swe_cli.add_command(parser)
    args = parser.parse_args(
        ["validate", str(path), "--recipe-options", json.dumps({"image_map": {image: "local/x:1"}})]
    )
    code = args.func(args)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"v.jsonl:1 {good['instance_id']}: swe-rebench-v2, image local/x:1 (repository at /minicalc)"
    )
    assert "swebench's parse_log_pytest" in out[0]
    assert out[1].startswith("v.jsonl:2 broken: does not load: missing required fields")
    assert out[-1].endswith("rows can run here") and code == 1
