"""A newcomer's documents hold to the code they describe.

* Every command and flag that the README, docs/index.md and the recipes' READMEs name is in
  `orchard-async COMMAND --help`, and every command the CLI has is in the README's command
  block. An example command line with no placeholder in it parses as the CLI parses it
  (`run` without `--out` does not).
* Every relative link resolves (a file in the repository, a heading in it), and docs/index.md
  links every document.
* docs/service-api.md lists exactly the routes the service registers.
* .ci/run installs every extra that a test names as its install command (CI fails where a
  user's machine skips). The README's quickstart stays two commands.
* `demo` ends with the next steps for the file it wrote, and each of them runs.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import tomllib
from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async.apps import cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
INDEX = REPO / "docs" / "index.md"
SERVICE_API = REPO / "docs" / "service-api.md"
RECIPE_READMES = sorted((REPO / "recipes").glob("*/README.md"))
NEWCOMER_DOCS = [README, INDEX, SERVICE_API, *RECIPE_READMES]
# Commands with actions of their own (`orchard-async bench exec`, `orchard-async images
# build`, a recipe's `orchard-async swe validate`): those whose help has an ACTION or
# SCENARIO to choose, found in the CLI (see groups()).
FLAG = re.compile(r"--?[A-Za-z][\w-]*")
# Words that make a command line an outline rather than one to run: alternatives, optional
# parts, elisions, metavars that are not values.
PLACEHOLDER = re.compile(r"\.\.\.|\[|\]|\||<|>|(?<![\w.-])(N|K|P|A|X|S|G|C|R|T|W|L|F|PATH|NAME|FILE)(?![\w.-])")


def help_text(*words: str) -> str:
    """`orchard-async WORDS --help`, as the user sees it."""
    return _help(tuple(words))


@functools.cache
def _help(words: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        cli.main([*words, "--help"])
    assert exited.value.code == 0, words
    return out.getvalue()


def subcommands(*words: str) -> set[str]:
    """The commands `orchard-async [WORDS] --help` lists: its {a,b,c}, or the indented names
    under a metavar (bench's SCENARIO, images' ACTION)."""
    text = help_text(*words)
    listed = re.search(r"^\s+\{([\w,-]+)\}", text, re.MULTILINE)
    if listed:
        return set(listed[1].split(","))
    return set(re.findall(r"^ {4}(\w[\w-]*)(?:\s{2,}|$)", text.split("positional arguments:")[1], re.MULTILINE))


@functools.cache
def groups() -> tuple[str, ...]:
    """The commands that take an action (or scenario) of their own, by their usage line."""
    return tuple(
        sorted(
            command
            for command in subcommands()
            if re.search(r"^usage: orchard-async \S+ \[-h\] (ACTION|SCENARIO)\b", help_text(command), re.M)
        )
    )


def flags_of(line: str) -> list[str]:
    """The options a command line names: its words that are flags, an outline's `[--x` and
    `--x=value` included; a quoted argument that holds a flag of another program is one word."""
    try:
        words = shlex.split(line)
    except ValueError:  # an outline's unbalanced quote
        words = line.split()
    flags = [flag.split("=", 1)[0] for word in words for flag in word.strip("[]").split("|")]
    return [flag for flag in flags if FLAG.fullmatch(flag)]


def has_flag(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


# -- what the documents say ------------------------------------------------------------------


def code_of(path: Path) -> list[tuple[str, bool]]:
    """The code a document shows, one item per command line, and whether it is in a block:
    every line of its fenced and indented blocks (a trailing backslash joins the next line)
    and every inline code span."""
    items: list[tuple[str, bool]] = []
    fenced = False
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            items.append((pending + line, True))
            pending = ""
        else:
            items += [(span, False) for span in re.findall(r"`([^`\n]+)`", line)]
    return items


def commands_in(path: Path, *, examples: bool = False) -> list[str]:
    """Each `orchard-async ...` command line in a document's code, up to its end (`&&`, `;`,
    a `#` comment). ``examples``: only those shown to be run, the lines of a block and the
    inline spans with an option; "`orchard-async view`" in a sentence names the command."""
    found = []
    for item, in_block in code_of(path):
        for match in re.finditer(r"(?:^|&&|;|\s)orchard-async (?=[a-z])(.*?)(?=\s&&|\s;|\s#|$)", item):
            line = "orchard-async " + match[1].strip()
            if not examples or in_block or flags_of(match[1]):
                found.append(line)
    return found


def command_block() -> list[str]:
    """The README's command block: one entry per `orchard-async` line, its indented
    continuation lines joined to it."""
    section = README.read_text().split("## Command line", 1)[1]
    block = section.split("```", 2)[1]
    entries: list[str] = []
    for line in block.splitlines()[1:]:
        if line.startswith("orchard-async "):
            entries.append(line)
        elif line.strip():
            entries[-1] += " " + line.strip()
    return entries


def helps_of(words: list[str]) -> list[str]:
    """The --help texts a command line's flags must be in: its command's, or for `bench`
    and `images` that of each action it names (`exec|burst`: both)."""
    command = words[1]
    if command in groups() and len(words) > 2 and set(words[2].split("|")) <= subcommands(command):
        return [help_text(command, action) for action in words[2].split("|")]
    return [help_text(command)]


# -- the README's command block against the CLI ----------------------------------------------


def test_every_command_of_the_cli_is_in_the_readmes_command_block() -> None:
    named = {entry.split()[1] for entry in command_block()}
    assert named == subcommands()
    assert {"bench", "images", "swe"} <= set(groups())  # the usage line still tells a group
    for group in groups():
        actions = {
            action for entry in command_block() if entry.split()[1] == group for action in entry.split()[2].split("|")
        }
        assert actions == subcommands(group), group


def test_every_flag_in_the_readmes_command_block_is_in_its_commands_help() -> None:
    missing = []
    for entry in command_block():
        words = entry.split()
        for flag in flags_of(" ".join(words[2:])):
            for text in helps_of(words):
                if not has_flag(text, flag):
                    missing.append(f"{' '.join(words[:3])}: {flag}")
    assert missing == []


def test_the_readmes_command_block_names_every_flag_of_every_command() -> None:
    """The issue's case: the block named 4 of serve's 12 flags, none of claw's or gui's."""
    entries = command_block()
    missing = []
    for command in sorted(subcommands()):
        for action in sorted(subcommands(command)) if command in groups() else [None]:
            words = (command, action) if action else (command,)
            named = " ".join(
                entry
                for entry in entries
                if entry.split()[1] == command and (action is None or action in entry.split()[2].split("|"))
            )
            flags = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", help_text(*words))) - {"-h", "--help"}
            missing += [f"{' '.join(words)} {flag}" for flag in sorted(flags) if not has_flag(named, flag)]
    assert missing == []


# -- every command every newcomer document shows ---------------------------------------------


@pytest.mark.parametrize("doc", NEWCOMER_DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_command_and_flag_a_document_names_exists(doc: Path) -> None:
    commands = subcommands()
    wrong = []
    for line in commands_in(doc):
        words = line.split()
        if words[1] not in commands:
            wrong.append(f"{line}: no command {words[1]!r}")
            continue
        for flag in flags_of(" ".join(words[2:])):
            if not all(has_flag(text, flag) for text in helps_of(words)):
                wrong.append(f"{line}: no flag {flag}")
    assert wrong == []


@pytest.mark.parametrize("doc", NEWCOMER_DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_example_command_line_parses(doc: Path) -> None:
    """An example to copy must run: the CLI's own parser accepts it (required options
    included), short of running it."""
    rejected = []
    for line in commands_in(doc, examples=True):
        if PLACEHOLDER.search(line.removeprefix("orchard-async ")):
            continue
        argv = shlex.split(line)[1:]
        try:
            cli.build_parser(argv).parse_args(argv)
        except (oa.ConfigError, SystemExit) as exc:
            rejected.append(f"{line}: {exc}")
    assert rejected == []


def test_the_placeholder_rule_still_leaves_the_examples_to_check() -> None:
    """The parse test above skips outlines; it must not skip the runnable examples."""
    runnable = [
        line for doc in NEWCOMER_DOCS for line in commands_in(doc, examples=True) if not PLACEHOLDER.search(line[14:])
    ]
    assert (
        "orchard-async run claw --tasks builtin --policy oracle --adapter local --episodes 40 --out out/claw-oracle.jsonl"
        in runnable
    )
    assert len(runnable) >= 20


def test_every_example_run_of_a_whole_task_set_gives_each_task_the_same_number_of_groups() -> None:
    """`run gui --tasks builtin --episodes 17` ran 17 of the 36 tasks: the plan cycles through
    the tasks, so a count that is not a multiple of the set's size leaves some out."""
    uneven = []
    for doc in NEWCOMER_DOCS:
        for line in commands_in(doc, examples=True):
            argv = shlex.split(line)[1:]
            if argv[0] != "run" or PLACEHOLDER.search(line[14:]):
                continue
            try:
                args = cli.build_parser(argv).parse_args(argv)
            except oa.ConfigError:
                continue  # test_every_example_command_line_parses reports it
            if not args.tasks.endswith("builtin"):  # a file, or chosen ids
                continue
            tasks = oa.runtime.load_recipe(args.recipe).load_tasks(args.tasks)
            if args.episodes % (len(tasks) * args.group_size):
                uneven.append(f"{line}: {len(tasks)} tasks")
    assert uneven == []


def test_a_run_without_out_is_rejected_by_the_parse_check() -> None:
    argv = ["run", "claw", "--tasks", "builtin", "--policy", "oracle", "--episodes", "40"]
    with pytest.raises(oa.ConfigError, match="--out"):
        cli.build_parser(argv).parse_args(argv)


def test_the_readme_tables_name_every_recipe_adapter_and_policy() -> None:
    text = README.read_text()
    recipes_table = text.split("## Recipes", 1)[1].split("\n\n", 2)[1]
    rows = {line.split("|")[1].split()[0].strip("`"): line.split("|")[4] for line in recipes_table.splitlines()[2:]}
    assert set(rows) == set(oa.runtime.recipe_names())
    for name, cell in rows.items():
        recipe = oa.runtime.load_recipe(name)
        named = set(re.findall(r"`([^`]+)`", cell))
        # the shared scripted policy, which a recipe may take without listing it
        try:
            shared = {"noisy-oracle:P"} if recipe.make_policy("noisy-oracle:0.5") else set()
        except oa.ConfigError:
            shared = set()
        assert named == set(recipe.POLICIES) | shared, name
    adapters_table = text.split("## Adapters", 1)[1].split("\n\n", 2)[1]
    assert {line.split("|")[1].strip(" `") for line in adapters_table.splitlines()[2:]} == set(oa.runtime.ADAPTERS)


def test_the_quickstart_is_two_commands() -> None:
    quickstart = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", quickstart, re.DOTALL)
    assert [block.strip() for block in blocks] == [
        "pip install -e . && orchard-async demo",
        "pip install -e '.[dev]' && python -m pytest",
    ]


# -- links and the index --------------------------------------------------------------------


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("doc", NEWCOMER_DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path = (doc.parent / target).resolve() if target else doc
        if not path.is_relative_to(REPO) or not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}#{anchor}")
    assert broken == []


def test_the_readme_links_the_index_and_the_service_api() -> None:
    text = README.read_text()
    assert "](docs/index.md)" in text and "](docs/service-api.md)" in text
    assert "shared/" not in text


def test_the_index_links_every_document() -> None:
    documents = [
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "recipes").glob("*/README.md")),
        REPO / "recipes" / "swe" / "builtin" / "README.md",
        *sorted((REPO / "deploy").glob("*/README.md")),
        README,
    ]
    index = INDEX.read_text()
    linked = {(INDEX.parent / target).resolve() for target in re.findall(r"\]\(([^)#\s]+)", index)}
    assert [str(doc.relative_to(REPO)) for doc in documents if doc != INDEX and doc not in linked] == []


# -- the service's routes --------------------------------------------------------------------


def test_the_service_api_lists_exactly_the_routes_the_service_registers() -> None:
    from orchard_async.apps.serve import create_app

    app = create_app(oa.get_adapter("sim"))
    registered = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"  # aiohttp adds one to every GET
    }
    table = SERVICE_API.read_text().split("## 9. Every route", 1)[1]
    documented = set(re.findall(r"^\| (GET|POST|DELETE|PUT|PATCH|\*) \| `([^`]+)` \|", table, re.MULTILINE))
    assert documented == registered


# -- installs --------------------------------------------------------------------------------


def test_ci_installs_every_extra_a_test_names_as_its_install_command() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (ci_install,) = re.findall(r"^pip install -e '\.\[([\w,-]+)\]'", (REPO / ".ci" / "run").read_text(), re.MULTILINE)
    installed = set(ci_install.split(","))
    covered = {name for name, requirements in extras.items() if set(requirements) <= set(extras["dev"])} | installed
    named = set()
    for test in (REPO / "tests").rglob("*.py"):
        named |= set(re.findall(r"pip install (?:-e )?'(?:\.|orchard-async)\[([\w-]+)\]'", test.read_text()))
    assert named, "no test names an extra: the pattern above no longer matches"
    assert named <= set(extras), named - set(extras)
    assert named - covered == set()


# -- demo's next steps -----------------------------------------------------------------------


def test_demo_ends_with_the_next_steps_for_its_file_and_each_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("COLUMNS", "300")
    assert cli.main(["demo", "--recipe", "toy", "--episodes", "2", "--out", "my run"]) == 0
    err = capsys.readouterr().err
    steps = err.split("next steps:\n", 1)[1].splitlines()
    commands = [shlex.split(step, comments=True) for step in steps if step.startswith("  orchard-async ")]
    assert [argv[1] for argv in commands] == ["view", "inspect", "export"]
    run_file = "my run/trajectories.jsonl"  # the path as given, quoted for the shell
    assert all(run_file in argv for argv in commands)

    view, inspect, export = (argv[1:] for argv in commands)
    assert cli.build_parser(view).parse_args(view).run == run_file
    assert cli.main(inspect + ["--json"]) == 0
    assert '"episodes":2' in capsys.readouterr().out.replace(" ", "")
    assert cli.main(export) == 0
    assert (tmp_path / "my run" / "sft.jsonl").exists()
