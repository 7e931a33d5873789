"""Shared test helpers. A backend that is not available skips its tests with the reason,
except in CI (CI=true), where a missing backend is a failure: skipping is for users' machines."""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter

import pytest


def backend_missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"backend required in CI is unavailable: {reason}")
    pytest.skip(reason)


async def docker_unready(image: str) -> str | None:
    """Why the docker tests cannot run here, or None: no aiodocker, no daemon answering, or
    ``image`` not built on it (then the reason is the exact command that builds it). Any other
    failure is a bug, never a skip: a broken import or doctor line must not skip every test."""
    try:
        from orchard_async.adapters.docker import DockerAdapter
    except ModuleNotFoundError as exc:  # aiodocker is an optional dependency
        if exc.name != "aiodocker":
            raise
        return f"docker: {exc}; pip install -e '.[docker]'"
    from orchard_async.errors import OrchardError
    from orchard_async.images import missing_image_hint

    try:
        status = await DockerAdapter(image=image).doctor()
    except OrchardError as exc:
        return f"docker: {exc}"
    if f"default image {image} present" in status:
        return None
    if f"default image {image} MISSING" in status:
        where = "the Docker daemon"
        return f"docker: image {image} is not on {where}: {missing_image_hint(image, where)}"
    raise AssertionError(f"the docker doctor line no longer says whether {image} is present: {status}")


def require_docker(image: str) -> None:
    """Skip (fail in CI) unless a Docker daemon answers here and has ``image``: a user whose
    daemon runs but who never built the test images is told the command, not a failure."""
    reason = asyncio.run(docker_unready(image))
    if reason:
        backend_missing(reason)


def cluster_configured() -> bool:
    """Kubernetes tests run where a cluster is configured; CI configures one when it starts it."""
    if os.environ.get("ORCHARD_K8S_TEST_CONTEXT"):
        return True
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return os.path.exists(path)


# -- running in parallel ---------------------------------------------------------------------
# `python -m pytest` runs on several workers (pytest-xdist, `-n` in pyproject's addopts). Tests of
# one group run one after another on one worker; the groups are files (a conformance file's
# docker and kubernetes tests apart from the rest), except that the files sharing the bundled
# SWE set's session fixture go together, and in the soak run (`-m soak`)
# everything that drives the Docker daemon is one group and everything that drives the cluster
# another: the soak tests restart the daemon and the API server under whatever else runs. The
# default run has no such test, and its tests find their own containers and pods by run id.
# (A scheduler of our own: xdist's `loadgroup` marks do not reach the scheduler under pytest 9.)
SHARED_SESSION_FIXTURE_FILES = {
    "tests/recipes/test_swe_builtin_data.py": "swe-builtin",
    "tests/recipes/test_swe_recipe.py": "swe-builtin",
    "tests/recipes/test_swe_parity.py": "swe-builtin",
}
DOCKER_FILES = {
    "tests/adapters/test_docker.py",
    "tests/bench/test_docker.py",
    "tests/recipes/test_claw_docker.py",
    "tests/recipes/test_claw_mini_swe_agent.py",
    "tests/recipes/test_gui_docker.py",
    "tests/recipes/test_swe_docker.py",
    "tests/recipes/test_swe_real_instances.py",
    "tests/adapters/test_docker_attach.py",
    "tests/adapters/test_docker_fork.py",
    "tests/service/test_restart.py",
    "tests/service/test_remote_restart.py",
    "tests/service/test_load.py",  # its docker soak runs must not overlap the daemon's restart
}
KUBERNETES_FILES = {
    "tests/adapters/test_kubernetes.py",
    "tests/adapters/test_kubernetes_hollow.py",
    "tests/service/test_restart_kubernetes.py",
    "tests/core/test_warm.py",  # its cluster rollout (soak) must not overlap the API server's restart
    "tests/adapters/test_kubernetes_snapshot.py",
}


def group_of(nodeid: str, *, soak: bool) -> str:
    path = nodeid.split("::", 1)[0]
    params = set(nodeid.partition("[")[2].rstrip("]").split("-"))  # conformance: the backend's name
    backend = next((name for name in ("docker", "kubernetes") if name in params), "")
    # A soak test named for its backend (`test_swe_formats_docker.py`, `..._on_docker`) drives
    # it, wherever it lives: a list of files alone missed new ones, which then ran during the
    # daemon's restart.
    named = set(re.split(r"[^a-z0-9]+", nodeid.partition("[")[0].lower()))
    if soak and (path in DOCKER_FILES or backend == "docker" or "docker" in named):
        return "docker"
    if soak and (path in KUBERNETES_FILES or backend == "kubernetes" or "kubernetes" in named):
        return "kubernetes"
    return SHARED_SESSION_FIXTURE_FILES.get(path, f"{path} {backend}".strip())


# The longest groups, longest first (by `--durations=0` summed per group), are handed out first:
# a long group that starts last ends the run last. The rest keep their order. (xdist would
# otherwise order groups by their number of tests: see pytest_xdist_make_scheduler.)
LONGEST_GROUPS = (
    "tests/adapters/test_docker.py",
    "tests/adapters/test_kubernetes.py",
    "swe-builtin",
    "tests/recipes/test_swe_instances.py",
    "tests/recipes/test_claw_recipe.py",
    "tests/recipes/test_swe_docker.py",
    "tests/core/test_cli.py",
    "tests/conformance/test_exec.py kubernetes",
    "tests/recipes/test_gui_browser.py",
    "tests/service/test_restart.py",
    "tests/bench/test_scenarios.py",
)


def running_soak(config: pytest.Config) -> bool:
    return "soak" in (config.getoption("markexpr") or "").replace("not soak", "")


# Files whose kubernetes rows are soak tests: a kubernetes fork is a containerd image import (or
# a tar through the pod) and new pods, 5-16 s a test, and the default run keeps its 5-minute
# budget; local and docker stay.
SOAK_ON_KUBERNETES = {"tests/conformance/test_fork.py"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("::", 1)[0] in SOAK_ON_KUBERNETES and "[kubernetes" in item.nodeid:
            item.add_marker(pytest.mark.soak)
        # The SWE set's whole oracle and empty runs (~50 s of CPU) are soak: the default run
        # keeps the README demo's oracle run (every task resolved, tests/test_fresh_install.py),
        # the cheating agents, and gold/empty on docker.
        if "builtin_validation" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.soak)
    rank = {group: place for place, group in enumerate(LONGEST_GROUPS)}
    soak = running_soak(config)
    items.sort(key=lambda item: rank.get(group_of(item.nodeid, soak=soak), len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    soak = running_soak(config)
    config.option.loadscopereorder = False  # keep our order (LONGEST_GROUPS first), not "most tests first"

    class ByBackend(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid, soak=soak)

    return ByBackend(config, log)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Why tests were skipped, one line per reason with its count: pytest shows skip reasons
    only with -rs, and a user whose docker tests skipped needs the command that builds the images."""
    if {"s", "a", "A"} & set(config.option.reportchars or ""):
        return  # -rs (or -ra) lists every skipped test already
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            reasons[report.longrepr[2].removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("skipped, by reason (-rs lists each test)")
        for reason, count in reasons.most_common():
            terminalreporter.line(f"{count:5d}  {reason}")
