"""Every ``ORCHARD_*`` environment variable: who reads it, its default, what it means.

    python -m orchard_async.apps.variables                            # the page, on stdout
    python -m orchard_async.apps.variables --write docs/variables.md  # the page in the docs

One registry, gathered from where each variable is declared:

* a recipe's variables are the defaults of its options: each ``RecipeOptions`` field that
  names one (``recipe_option(meaning, "ORCHARD_...")``), read only by ``from_env``;
* the model client's and the event loop's are the ``ENVIRONMENT`` of their modules
  (``orchard_async.models.client``, ``orchard_async.runtime``);
* the rest are settings of a backend, the image builder, the service, the bench, the test
  suite or the scripts, read where they are used; they are declared in ``ELSEWHERE`` below.

``tests/core/test_variables.py`` scans the source tree for every ``ORCHARD_*`` name that is
read and fails on one missing here, and fails when docs/variables.md is not ``markdown()``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from orchard_async.errors import ConfigError
from orchard_async.runtime import RecipeOptions

RECIPES = ("swe", "gui", "claw", "toy")  # the project's own (an installed third-party recipe is not in its docs)
DECLARING = ("orchard_async.runtime", "orchard_async.models.client")  # modules with an ENVIRONMENT dict
TESTS, SCRIPTS = "tests (pytest)", "scripts/"


class Variable(NamedTuple):
    name: str
    owner: str  # the module (or script) that reads it and gives it its meaning
    default: str  # as the owner takes it when the variable is unset
    meaning: str


ELSEWHERE = (
    # backends
    Variable(
        "ORCHARD_LOCAL_ROOT", "orchard_async.adapters.local", "$TMPDIR/orchard-async",
        "where the local adapter keeps its sandboxes' dirs and leases",
    ),
    Variable(
        "ORCHARD_SANDBOX", "orchard_async.adapters.local", "(set by the adapter)",
        "the sandbox's dir, in the environment of every process of a local sandbox: reap finds leftovers by it, "
        "and the claw services find the sandbox's python3 under it",
    ),
    Variable(
        "ORCHARD_REMOTE_URL", "orchard_async.adapters.remote", "$SANDBOX_BASE_URL, else http://127.0.0.1:8000",
        "the `orchard-async serve` the remote adapter talks to (its url option)",
    ),
    Variable(
        "ORCHARD_REMOTE_KEY", "orchard_async.adapters.remote", "$SANDBOX_API_KEY",
        "the remote adapter's API key (its api_key option)",
    ),
    Variable(
        "ORCHARD_K8S_IMAGE", "orchard_async.adapters.kubernetes", "local/busybox:1",
        "the image of a sandbox whose spec names none (the image option); scripts/ci-kubernetes.sh sets it",
    ),
    Variable(
        "ORCHARD_K8S_NAMESPACE", "orchard_async.adapters.kubernetes", "orchard",
        "where the pods live (the namespace option); the kubernetes bench reads it too",
    ),
    Variable(
        "ORCHARD_K8S_CONTEXT", "orchard_async.adapters.kubernetes", "(the kubeconfig's current context)",
        "the kubeconfig context (the context option)",
    ),
    Variable(
        "ORCHARD_K8S_SNAPSHOT_DIR", "orchard_async.adapters.kubernetes.snapshot",
        "$XDG_CACHE_HOME/orchard-async/kubernetes-snapshots", "where tar snapshots are kept (the snapshot_dir option)",
    ),
    # the core's tools and apps
    Variable(
        "ORCHARD_IMAGE_STATE", "orchard_async.images.build", "/var/tmp/orchard-images",
        "work files and logs of `orchard-async images build`",
    ),
    Variable(
        "ORCHARD_K8S_WORK", SCRIPTS + "ci-kubernetes.sh", "/tmp/orchard-k8s",
        "the local one-node cluster's state dir; images build (its containerd), the hollow-node bench and the "
        "kubernetes tests read it",
    ),
    Variable(
        "ORCHARD_SERVE_BASH_LANE", "orchard_async.apps.serve.app", "1",
        "0: the service runs Orchard commands as a new `bash -c` each, without its bash lanes (for comparison)",
    ),
    Variable(
        "ORCHARD_REPO", "orchard_async.recipes.swe.scoring", "(set by the recipe)",
        "the repository's path, for SWE-bench's evaluation script in the sandbox (its `cd /testbed`)",
    ),
    # bench
    Variable(
        "ORCHARD_K8S_SCRIPTS", SCRIPTS + "ci-kubernetes.sh", "(set by the script)",
        "the scripts folder, for the bench and tests that stop and start the cluster's API server",
    ),
    # the test suite
    Variable("ORCHARD_TEST_BACKENDS", TESTS, "(every backend here)", "the backends the conformance and bench tests run on, e.g. local,docker"),
    Variable("ORCHARD_DOCKER_TEST_IMAGE", TESTS, "orchard/busybox:test", "the docker tests' image"),
    Variable("ORCHARD_CLAW_TEST_IMAGE", TESTS, "orchard/python:test", "the claw recipe's docker tests' image"),
    Variable("ORCHARD_K8S_TEST_CONTEXT", TESTS, "(none: no cluster tests)", "the kubeconfig context of the kubernetes tests"),
    Variable("ORCHARD_K8S_TEST_NAMESPACE", TESTS, "orchard-test", "the kubernetes tests' namespace"),
    Variable("ORCHARD_K8S_TEST_IMAGE", TESTS, "local/busybox:1", "the kubernetes tests' image"),
    Variable("ORCHARD_K8S_RELAY_IMAGE", TESTS, "$ORCHARD_K8S_IMAGE", "an image with python3, for the kubernetes stream relay tests"),
    Variable(
        "ORCHARD_K8S_POD_MAX_PIDS", SCRIPTS + "ci-kubernetes.sh", "1024",
        "the kubelet's per-pod pids limit, for the kubernetes tests that check it",
    ),
    Variable(
        "ORCHARD_FRESH_VENV", ".ci/run", "(a venv the test builds)",
        "a bare venv with `pip install -e .`, for the fresh-install test",
    ),
    Variable(
        "ORCHARD_HARBOR_VENV", ".ci/run", "(none: the Harbor runner tests skip)",
        "a Python 3.12 venv with `pip install -e '.[harbor,kubernetes]'`, for the tests of Harbor's runner over orchard_async.harbor",
    ),
    Variable(
        "ORCHARD_ATTACK_CANARY", TESTS, "(set by the test)",
        "a secret in the test process's environment that no sandbox may read (conformance attacks)",
    ),
    # the scripts
    Variable("ORCHARD_DOCKERD_PID", SCRIPTS + "docker-up.sh", "/tmp/orchard-dockerd.pid", "the pid file of the dockerd the script started (docker-down.sh and the docker tests read it)"),
    Variable("ORCHARD_DOCKERD_LOG", SCRIPTS + "docker-up.sh", "/tmp/orchard-dockerd.log", "that dockerd's log"),
    Variable("ORCHARD_DOCKERD_WAIT", SCRIPTS + "docker-up.sh", "60", "seconds to wait for `docker info`"),
    Variable("ORCHARD_DOCKERD_ARGS", SCRIPTS + "docker-up.sh", "(none)", 'extra dockerd flags, e.g. "--storage-driver=vfs"'),
    Variable("ORCHARD_DOCKER_DATA_ROOT", SCRIPTS + "docker-up.sh", "/var/lib/docker", "dockerd's data root"),
    Variable(
        "ORCHARD_HOST_NS_PID", SCRIPTS + "docker-up.sh", "1",
        "a process in the host's namespaces, where dockerd starts (ci-kubernetes.sh sets it)",
    ),
    Variable("ORCHARD_DOCKERD_STOP_WAIT", SCRIPTS + "docker-down.sh", "20", "seconds between SIGTERM and SIGKILL"),
    Variable("ORCHARD_PYTHON", SCRIPTS + "docker-images.sh", "$VIRTUAL_ENV/bin/python, else python3", "the Python that builds the images"),
    Variable("ORCHARD_K8S_IMAGES", SCRIPTS + "ci-kubernetes.sh", "/var/tmp/orchard-k8s-images", "where the cluster's image archives are kept"),
    Variable("ORCHARD_K8S_PYTHON_IMAGE", SCRIPTS + "ci-kubernetes.sh", "orchard/python:test", "the python image loaded into the cluster"),
    Variable(
        "ORCHARD_K8S_EXTRA_IMAGES", SCRIPTS + "ci-kubernetes.sh", "orchard/swe-python:bookworm",
        "more docker images loaded into the cluster (space-separated)",
    ),
)  # fmt: skip


def shown(value: Any) -> str:
    """An option's default as a variable's text."""
    if value is None or value == "":
        return "(none)"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value)


def recipe_options() -> dict[str, type[RecipeOptions]]:
    """The project's recipes' options structs, by recipe."""
    found = {}
    for name in RECIPES:
        module = importlib.import_module(f"orchard_async.recipes.{name}")  # imported only when asked: a plugin
        found[name] = module.OPTIONS
    return found


def registry() -> list[Variable]:
    """Every variable, sorted by name. Two declarations of one name are a ConfigError."""
    variables: list[Variable] = []
    for name, options in recipe_options().items():
        for option in options.fields():
            if option.env:
                owner = f"orchard_async.recipes.{name} (option {option.name})"
                variables.append(Variable(option.env, owner, shown(option.default), option.meaning))
    for module_name in DECLARING:
        module = importlib.import_module(module_name)
        variables += [Variable(name, module_name, d, m) for name, (d, m) in module.ENVIRONMENT.items()]
    variables += ELSEWHERE
    names = [v.name for v in variables]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"declared twice: {', '.join(twice)}")
    return sorted(variables)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/variables.md."""
    lines = [
        "# Environment variables",
        "",
        "<!-- generated by `python -m orchard_async.apps.variables --write docs/variables.md`; "
        "tests/core/test_variables.py keeps it true -->",
        "",
        "Every `ORCHARD_*` variable the project reads. A recipe's variables are only the defaults of its",
        "options: `--recipe-options JSON` (or the same keywords from Python) wins over them (see",
        '"Recipe options" below). The model settings are read in one place, `ModelConfig.from_env`',
        "(`orchard_async.models.client`). The adapters' variables are defaults of their options",
        "(`--adapter-options`); the rest belong to the tools, the test suite and the scripts.",
        "",
        "| variable | owner | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| `{v.name}` | {v.owner} | {_cell(v.default)} | {_cell(v.meaning)} |" for v in registry()]
    lines += [
        "",
        "## Recipe options",
        "",
        "What `orchard-async run RECIPE --recipe-options '{...}'` takes, and `load_tasks(source, **options)`,",
        "`make_policy(name, **options)` from Python (or `options=` the recipe's struct, or a dict). An unknown",
        "key or a value of the wrong type is one error line and exit status 2. An option's variable,",
        "when set, is its default; a struct built in Python keeps its own defaults.",
    ]
    for name, options in recipe_options().items():
        lines += [
            "",
            f"### {name} (`{options.__module__}.{options.__name__}`)",
            "",
            "| option | type | default | variable | meaning |",
            "| --- | --- | --- | --- | --- |",
        ]
        for option in options.fields():
            default = json.dumps(option.default)
            variable = f"`{option.env}`" if option.env else ""
            lines.append(
                f"| `{option.name}` | {_cell(option.kind)} | `{_cell(default)}` | {variable} | {_cell(option.meaning)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard_async.apps.variables", description=__doc__.split("\n")[0])
    parser.add_argument("--write", metavar="PATH", help="write the page there instead of printing it")
    args = parser.parse_args(argv)
    text = markdown()
    if args.write:
        Path(args.write).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
