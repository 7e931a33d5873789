"""Bad input on the command line: one line on stderr, exit status 2, nothing written or changed.

Most cases call ``main()`` in this process (it is the console script's entry point, argparse
included) so that the many cases stay fast; a few run the real command in a subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async import runtime
from orchard_async.apps import cli
from orchard_async.records.trajectory import read_run_header

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
UNWRITABLE_DIR = "/proc/orchard-no-such-dir"  # no one can create files in /proc, not even root


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its bytes and mtime (directories: just that they exist;
    the writability probe may touch their mtime, never their entries)."""
    state: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            state[str(path.relative_to(root))] = ("dir",)
        else:
            state[str(path.relative_to(root))] = ("file", path.read_bytes(), path.stat().st_mtime_ns)
    return state


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a few things in it to get wrong: a plain file, a directory,
    a trajectory file (a real run on sim), a JSON file that is not a trajectory."""
    root = tmp_path / "work"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(tmp_path / "sandboxes"))
    (root / "afile").write_text("not a directory\n")
    (root / "adir").mkdir()
    (root / "notes.jsonl").write_text('{"note": "not a trajectory"}\n')
    (root / "garbage.msgpack").write_bytes(b"\x00\x00\x00\x05hello" + b"\xff" * 40)
    (root / "empty.jsonl").write_bytes(b"")
    (root / "result.txt").write_text("not json at all\n")
    (root / "other.json").write_text(json.dumps({"some": "json", "rows": "no"}))
    (root / "demo" / "trajectories.jsonl").mkdir(parents=True)
    assert cli.main(["run", "--adapter", "sim", "--episodes", "4", "--out", "run.jsonl"]) == 0
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    return code, err.splitlines()


CASES = [
    # --adapter-options
    (["demo", "--adapter", "sim", "--adapter-options", '{"bogus": 1}'], "the sim adapter has no option 'bogus'"),
    (["run", "--adapter", "local", "--adapter-options", '{"image": "x"}', "--out", "n.jsonl"], "its options are: root"),
    (["run", "--adapter", "sim", "--adapter-options", "[1, 2]", "--out", "n.jsonl"], "must be a JSON object"),
    (["run", "--adapter", "sim", "--adapter-options", '"sim"', "--out", "n.jsonl"], "must be a JSON object"),
    (["demo", "--adapter", "sim", "--adapter-options", "{bad json"], "not valid JSON"),
    (["run", "--adapter", "sim", "--adapter-options", '{"seed": "x"}', "--out", "n.jsonl"], "bad option for the sim"),
    (["reap", "--adapter", "local", "--adapter-options", '{"nope": 1}'], "has no option 'nope'"),
    # --out of demo: a directory is wanted
    (["demo", "--adapter", "sim", "--out", "afile"], "--out afile is a file; give a directory"),
    (["demo", "--adapter", "sim", "--out", "afile/sub"], "afile is a file, not a directory"),
    (["demo", "--adapter", "sim", "--out", UNWRITABLE_DIR], "cannot write in /proc"),
    (["demo", "--adapter", "sim", "--out", "demo"], "trajectories.jsonl is a directory"),
    # --out of run: a trajectory file is wanted
    (["run", "--adapter", "sim", "--out", "adir"], "--out adir is a directory"),
    (["run", "--adapter", "sim", "--out", "afile/t.jsonl"], "afile is a file, not a directory"),
    (["run", "--adapter", "sim", "--out", f"{UNWRITABLE_DIR}/t.jsonl"], "cannot write in /proc"),
    (["run", "--adapter", "sim", "--out", "t.csv"], ".jsonl or .msgpack"),
    (["run", "--adapter", "sim", "--out", "run.jsonl"], "already has trajectories"),
    # export
    (["export", "sft", "run.jsonl", "--out", "adir"], "--out adir is a directory"),
    (["export", "sft", "run.jsonl", "--out", f"{UNWRITABLE_DIR}/e.jsonl"], "cannot write in /proc"),
    (["export", "sft", "run.jsonl", "--out", "afile/e.jsonl"], "afile is a file, not a directory"),
    (["export", "sft", "run.jsonl", "--out", "run.jsonl"], "is a trajectory file being exported"),
    (["export", "sft", "adir", "--out", "e.jsonl"], "adir is a directory, not a trajectory file"),
    (["export", "grpo", "notes.jsonl", "--out", "e.jsonl"], "notes.jsonl is not a trajectory file"),
    (["export", "sft", "missing.jsonl", "--out", "e.jsonl"], "missing.jsonl: no such file"),
    # inspect
    (["inspect", "adir"], "adir is a directory, not a trajectory file"),
    (["inspect", "notes.jsonl"], "notes.jsonl is not a trajectory file"),
    (["inspect", "garbage.msgpack"], "garbage.msgpack is not a trajectory file"),
    (["inspect", "result.txt"], "unknown trajectory format"),
    (["inspect", "missing.jsonl"], "no such file"),
    # bench outputs and compare
    (["bench", "exec", "--json", "adir"], "--json adir is a directory"),
    (["bench", "exec", "--json", f"{UNWRITABLE_DIR}/b.json"], "cannot write in /proc"),
    (["bench", "exec", "--json", "afile/b.json"], "afile is a file, not a directory"),
    (["bench", "exec", "--markdown", "adir"], "--markdown adir is a directory"),
    # the formats come from matplotlib (the plot extra): without it, that is the one line
    (["bench", "exec", "--plot", "picture.xyz"], "picture suffix" if HAVE_MATPLOTLIB else "--plot needs matplotlib"),
    (["bench", "compare", "result.txt", "result.txt"], "result.txt is not a bench result"),
    (["bench", "compare", "other.json", "other.json"], "other.json is JSON but not a bench result"),
    (["bench", "compare", "run.jsonl", "run.jsonl"], "run.jsonl is not a bench result"),
    (["bench", "compare", "missing.json", "other.json"], "missing.json: no such file"),
    (["bench", "compare", "adir", "other.json"], "adir is a directory"),
    (["bench", "show", "result.txt"], "is not a bench result"),
    # counts
    (["run", "--episodes", "0", "--out", "n.jsonl"], "--episodes: must be at least 1, got 0"),
    (["demo", "--episodes", "-3"], "--episodes: must be at least 1, got -3"),
    (["run", "--episodes", "many", "--out", "n.jsonl"], "'many' is not a whole number"),
    (["run", "--concurrency", "0", "--out", "n.jsonl"], "--concurrency: must be at least 1"),
    (["run", "--group-size", "0", "--out", "n.jsonl"], "--group-size: must be at least 1"),
    (["run", "--max-retries", "-1", "--out", "n.jsonl"], "--max-retries: must be at least 0"),
    (["run", "--episodes", "5", "--group-size", "2", "--out", "n.jsonl"], "multiple of the group size"),
    (["reap", "--older-than", "inf"], "--older-than: must be 0 or more seconds"),
    # usage errors: argparse's, in one line
    (["run"], "the following arguments are required: --out"),
    (["run", "--out", "n.jsonl", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    ([], "the following arguments are required: command"),
    (["bench", "nosuch"], "invalid choice: 'nosuch'"),
    (["images"], "required: ACTION"),
    (["images", "build", "--adapter", "local"], "invalid choice: 'local'"),
    # names
    (["demo", "--adapter", "nosuch"], "unknown adapter 'nosuch'"),
    (["run", "--policy", "clever", "--out", "n.jsonl"], "unknown policy 'clever'"),
    (["run", "nosuch", "--out", "n.jsonl"], "unknown recipe 'nosuch'"),
    (["run", "toy", "--tasks", "elsewhere.jsonl", "--out", "n.jsonl"], "only built-in tasks"),
    # --resume of a different run
    (["run", "--adapter", "sim", "--episodes", "4", "--policy", "random", "--resume", "--out", "run.jsonl"], "policy"),
    (["run", "--adapter", "sim", "--episodes", "2", "--resume", "--out", "run.jsonl"], "episodes: 4 in the file"),
    (["run", "--adapter", "local", "--episodes", "4", "--resume", "--out", "run.jsonl"], "adapter: sim in the file"),
    (
        ["run", "--adapter", "sim", "--episodes", "4", "--group-size", "2", "--resume", "--out", "run.jsonl"],
        "group_size",
    ),
    (
        [
            "run",
            "--adapter",
            "sim",
            "--adapter-options",
            '{"seed": 9}',
            "--episodes",
            "4",
            "--resume",
            "--out",
            "run.jsonl",
        ],
        "adapter_options",
    ),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(argv) or "(nothing)" for argv, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    work: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    before = snapshot(work)
    code, lines = run_cli(capsys, *argv)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert snapshot(work) == before, "bad input wrote or changed something"


def test_a_resume_refusal_names_every_difference(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (work / "run.jsonl").read_bytes()
    code, lines = run_cli(
        capsys, "run", "--adapter", "sim", "--policy", "random", "--episodes", "2", "--resume", "--out", "run.jsonl"
    )
    assert code == 2 and len(lines) == 1
    assert "cannot resume run.jsonl: it is a different run" in lines[0]
    assert "episodes: 4 in the file, 2 now" in lines[0] and "policy: oracle in the file, random now" in lines[0]
    assert (work / "run.jsonl").read_bytes() == before


def test_resume_of_the_same_run_may_extend_it(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = read_run_header(work / "run.jsonl")
    assert header is not None and header["recipe"] == "toy" and header["task_source"] == "builtin"
    assert (header["policy"], header["adapter"], header["episodes"], header["group_size"]) == ("oracle", "sim", 4, 1)
    code, _ = run_cli(capsys, "run", "--adapter", "sim", "--episodes", "6", "--resume", "--out", "run.jsonl")
    assert code == 0
    assert len(list(oa.read_trajectories(work / "run.jsonl", strict=True))) == 6
    assert read_run_header(work / "run.jsonl") == header  # the file's first record is unchanged


def test_inspect_of_an_empty_trajectory_file_is_zero_episodes(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["inspect", "empty.jsonl", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["episodes"] == 0


# -- errors from inside the rollout: a task group wraps them ---------------------------------


class ImageMissing(oa.ConfigError):
    """What a container adapter raises at create when the sandbox image is not there."""


class MissingImageAdapter:
    """An adapter whose every create fails the way a missing docker image does."""

    name = "missing-image"

    def __init__(self) -> None:
        self.creates = 0

    async def create(self, spec: oa.SandboxSpec) -> oa.Sandbox:
        self.creates += 1
        raise ImageMissing("image orchard/python:test is not on this machine; run `orchard-async images build`")

    async def list_owned(self) -> list[str]:
        return []

    async def reap(self, older_than: float = 0.0) -> list[str]:
        return []

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> MissingImageAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@pytest.mark.parametrize("command", ["demo", "run"])
def test_an_error_raised_inside_the_rollout_is_one_line(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setitem(runtime.ADAPTERS, "missing-image", f"{__name__}:MissingImageAdapter")
    (work / "old").mkdir()
    (work / "old" / "trajectories.jsonl").write_bytes((work / "run.jsonl").read_bytes())
    before = snapshot(work)
    common = ["--adapter", "missing-image", "--episodes", "8", "--concurrency", "4"]
    if command == "demo":
        argv = ["demo", "--recipe", "toy", *common, "--out", "old"]
    else:
        argv = ["run", "toy", *common, "--out", "new.jsonl"]
    code, lines = run_cli(capsys, *argv)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == "error: image orchard/python:test is not on this machine; run `orchard-async images build`"
    # the demo's old file is replaced only when an episode ends: none did, so it is as it was
    assert snapshot(work) == before


def test_orchard_leaf_unwraps_groups_of_orchard_errors_only() -> None:
    first, second = ImageMissing("first"), oa.CreateFailed("second")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [first, second]), oa.ConfigError("third")])
    assert cli.orchard_leaf(nested) is first
    assert cli.orchard_leaf(oa.ConfigError("plain")).args == ("plain",)
    assert cli.orchard_leaf(ExceptionGroup("mixed", [first, RuntimeError("a bug")])) is None
    assert cli.orchard_leaf(RuntimeError("a bug")) is None
    assert cli.one_line(oa.ConfigError("line one\n  line two\n")) == "line one; line two"


def test_a_bug_inside_the_rollout_still_shows_its_traceback(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Buggy(MissingImageAdapter):
        async def create(self, spec: oa.SandboxSpec) -> oa.Sandbox:
            raise ZeroDivisionError("a bug, not bad input")

    monkeypatch.setattr(sys.modules[__name__], "BuggyAdapter", Buggy, raising=False)
    monkeypatch.setitem(runtime.ADAPTERS, "buggy", f"{__name__}:BuggyAdapter")
    with pytest.raises(BaseExceptionGroup) as caught:
        cli.main(["run", "--adapter", "buggy", "--episodes", "2", "--out", "b.jsonl"])
    assert caught.group_contains(ZeroDivisionError)


class BrokenDoctorAdapter(MissingImageAdapter):
    """An adapter whose doctor() has a bug; it counts its closes."""

    name = "broken-doctor"
    closed = 0

    async def doctor(self) -> str:
        raise KeyError("a bug in the doctor")

    async def close(self) -> None:
        BrokenDoctorAdapter.closed += 1


def test_doctor_reports_every_adapter_when_one_doctor_has_a_bug(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [name for name in runtime.ADAPTERS if name not in ("local", "sim")]:
        monkeypatch.delitem(runtime.ADAPTERS, name)  # only backends that are always here
    monkeypatch.setitem(runtime.ADAPTERS, "broken-doctor", f"{__name__}:BrokenDoctorAdapter")
    monkeypatch.setattr(BrokenDoctorAdapter, "closed", 0)
    monkeypatch.setenv("COLUMNS", "500")  # no cell of the table wraps
    capsys.readouterr()
    assert cli.main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "its doctor failed (a bug): KeyError: 'a bug in the doctor'" in out
    assert "│ sim │ yes │ ready" in out and "local adapter isolation in force" in out
    assert BrokenDoctorAdapter.closed == 1


def test_doctor_prints_the_install_command_of_an_adapter_whose_package_is_missing(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a user who installed without the docker extra: the command keeps its `[docker]`
    (rich would read it as markup and print `pip install 'orchard-async'`)."""
    for name in [name for name in runtime.ADAPTERS if name not in ("local", "sim", "docker")]:
        monkeypatch.delitem(runtime.ADAPTERS, name)
    monkeypatch.setitem(sys.modules, "aiodocker", None)  # import aiodocker: ModuleNotFoundError
    for name in [name for name in sys.modules if name.startswith("orchard_async.adapters.docker")]:
        monkeypatch.delitem(sys.modules, name)  # imported again, as in a process that never had aiodocker
    monkeypatch.setenv("COLUMNS", "500")
    capsys.readouterr()
    try:
        assert cli.main(["doctor"]) == 0
    finally:  # what the failed import left half-made goes; monkeypatch puts the real modules back
        for name in [name for name in sys.modules if name.startswith("orchard_async.adapters.docker")]:
            del sys.modules[name]
    out = " ".join(capsys.readouterr().out.split())
    assert "│ docker │ no │ the docker adapter needs aiodocker; pip install 'orchard-async[docker]' │" in out


def test_images_build_without_the_images_module_is_one_line(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "orchard_async.images.build", None)  # as if it were not installed
    code, lines = run_cli(capsys, "images", "build", "orchard/python:test")
    assert code == 2 and len(lines) == 1 and "image building is not available" in lines[0], lines


def test_images_build_calls_build_images(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    class FakeImages:
        @staticmethod
        def build_images(names: list[str], *, adapter: str, force: bool) -> int:
            calls.append((names, adapter, force))
            return 3

    monkeypatch.setitem(sys.modules, "orchard_async.images.build", FakeImages)
    assert cli.main(["images", "build", "a", "b", "--adapter", "kubernetes", "--force"]) == 3
    assert cli.main(["images", "build"]) == 3
    assert calls == [(["a", "b"], "kubernetes", True), ([], "docker", False)]


# -- the real command, in a subprocess -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--episodes", "0", "--out", "x.jsonl"], "--episodes: must be at least 1"),
        (["run"], "the following arguments are required: --out"),
        (["demo", "--adapter", "sim", "--adapter-options", '{"bogus": 1}', "--out", "D"], "has no option 'bogus'"),
        (["inspect", "."], "is a directory"),
    ],
)
def test_the_installed_command_prints_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert done.stdout == "" and not list(tmp_path.iterdir())
