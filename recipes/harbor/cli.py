"""``orchard-async harbor``: look at Harbor task folders before running them.

    orchard-async harbor validate DIR [--adapter docker] [--recipe-options JSON]
    orchard-async harbor build DIR [--adapter kubernetes] [--recipe-options '{"image_map": {"ubuntu:24.04": "orchard/bookworm:min"}}']

``validate`` says per task whether it loads, whether it runs on the adapter, and why not,
without running it (exit 0 when every task runs, 1 when one does not, 2 for a bad DIR);
``build`` builds the tasks' ``environment/Dockerfile`` images with docker (``images``); with
``--adapter kubernetes`` it also imports every image the tasks run (built or named) into the
local one-node cluster's containerd, as ``orchard-async images build --adapter kubernetes`` does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchard_async import ConfigError
from orchard_async.recipes.harbor import images
from orchard_async.recipes.harbor.task import HarborOptions, HarborTask, SeparateHarborTask, load_task, task_folders

CONTAINER_ADAPTERS = ("docker", "kubernetes")
# Adapters whose sandboxes switch egress while they run (allowlists need it); read from the
# adapter class when the library declares it (capabilities.NetworkControl).
NETWORK_SWITCHING = ("docker", "kubernetes", "local")
# Adapters whose root cannot become another user (no CAP_SETUID): a task's non-root user fails there.
USERLESS_ADAPTERS = ("docker",)


@dataclass
class Verdict:
    name: str
    loads: bool
    runs: bool
    why: str = ""
    task: HarborTask | None = None

    def line(self) -> str:
        state = "runs" if self.runs else ("loads, does not run" if self.loads else "does not load")
        return f"{self.name}: {state}" + (f": {self.why}" if self.why else "")


def _switches_network(adapter: str) -> bool:
    try:
        from orchard_async import capabilities
    except ImportError:  # pragma: no cover - the contract is always there
        return False
    return hasattr(capabilities, "NetworkControl") and adapter in NETWORK_SWITCHING


def runs_on(task: HarborTask, adapter: str, *, check_images: bool = True) -> str:
    """Why ``task`` cannot run on ``adapter``, or "" when it can."""
    config = task.config
    steps = config.steps or (None,)
    networks = [config.agent_network(s) for s in steps] + [config.verifier_network(s) for s in steps]
    if any(n.mode == "allowlist" for n in networks) and not _switches_network(adapter):
        return f"network_mode 'allowlist' needs sandboxes that switch egress; {adapter} here does not"
    if adapter == "sim":
        return "the sim adapter runs no commands"
    users = {
        task.agent_user,
        config.verifier.user,
        *(s.agent.user for s in config.steps),
        *(s.verifier.user for s in config.steps),
    }
    others = sorted(str(u) for u in users if u is not None and str(u) not in ("root", "0"))
    if others and adapter in USERLESS_ADAPTERS:
        return f"user {others[0]!r}: the {adapter} adapter's sandboxes cannot switch users (every capability dropped)"
    if adapter in CONTAINER_ADAPTERS and check_images:
        wanted = [task.spec.image] + (
            [task.scorer_spec.image] if isinstance(task, SeparateHarborTask) and task.scorer_spec else []
        )
        for image in dict.fromkeys(i for i in wanted if i):
            if not images.docker_available():
                return "no docker CLI here to look for its image"
            if not images.image_present(image):
                if image == task.built_image or image.startswith("orchard-harbor/"):
                    return f"image {image} is not built yet: orchard-async harbor build {task.folder}"
                return f"image {image} is not on this machine (no registry): map it with the image_map option"
    return ""


def validate(source: Path, options: HarborOptions, adapter: str, *, check_images: bool = True) -> list[Verdict]:
    verdicts = []
    for folder in task_folders(source):
        try:
            task = load_task(folder, options)
        except (ConfigError, OSError, UnicodeDecodeError) as exc:
            verdicts.append(Verdict(folder.name, False, False, str(exc)))
            continue
        why = runs_on(task, adapter, check_images=check_images)
        verdicts.append(Verdict(folder.name, True, not why, why, task))
    return verdicts


def build_all(source: Path, options: HarborOptions, adapter: str = "docker") -> int:
    if not images.docker_available():
        raise ConfigError("building a task's Dockerfile needs the docker CLI and a daemon")
    address = images.cluster_containerd() if adapter == "kubernetes" else None
    failed = 0
    for verdict in validate(source, options, "local", check_images=False):
        task = verdict.task
        if task is None:
            print(f"{verdict.name}: skipped: {verdict.why}")
            continue
        contexts = []
        if task.built_image:
            contexts.append((task.built_image, task.folder / "environment"))
        scorer = task.scorer_spec if isinstance(task, SeparateHarborTask) else None
        if (
            scorer is not None
            and scorer.image
            and scorer.image.startswith("orchard-harbor/")
            and scorer.image != task.built_image
        ):
            contexts.append((scorer.image, task.folder / "tests"))
        for tag, context in contexts:
            try:
                built = images.build(tag, context, task.image_map, timeout=task.config.environment.build_timeout_sec)
                print(f"{verdict.name}: {tag} {'built' if built else 'already here'}")
            except (ConfigError, RuntimeError) as exc:
                print(f"{verdict.name}: {exc}", file=sys.stderr)
                failed += 1
        if address is None:
            continue
        scorer_image = task.scorer_spec.image if isinstance(task, SeparateHarborTask) and task.scorer_spec else None
        for tag in dict.fromkeys(i for i in (task.spec.image, scorer_image) if i):
            try:
                imported = images.import_into_containerd(tag, address)
                print(f"{verdict.name}: {tag} {'imported into' if imported else 'already in'} containerd")
            except (subprocess.TimeoutExpired, RuntimeError) as exc:
                print(f"{verdict.name}: {exc}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


def _options(text: str | None) -> HarborOptions:
    try:
        given = json.loads(text) if text else {}
    except ValueError as exc:
        raise ConfigError(f"--recipe-options is not valid JSON ({exc})") from None
    if not isinstance(given, dict):
        raise ConfigError("--recipe-options must be a JSON object")
    return HarborOptions.resolve(given)


def main(args: argparse.Namespace) -> int:
    source = Path(args.dir).expanduser()
    if not source.exists():
        raise ConfigError(f"{source}: no such folder")
    options = _options(args.recipe_options)
    if args.harbor_command == "build":
        return build_all(source, options, args.adapter)
    verdicts = validate(source, options, args.adapter)
    for verdict in verdicts:
        print(verdict.line())
    running = sum(v.runs for v in verdicts)
    print(f"{running} of {len(verdicts)} tasks run on {args.adapter}")
    return 0 if running == len(verdicts) else 1


def add_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``harbor`` subcommand (built only when it is the command run)."""
    sub = parser.add_subparsers(dest="harbor_command", required=True, metavar="ACTION")
    check = sub.add_parser("validate", help="per task: loads, runs on the adapter, and why not (runs nothing)")
    check.add_argument("dir", metavar="DIR", help="a Harbor dataset folder, or one task folder")
    check.add_argument("--adapter", default="local", help="the adapter it would run on (default local)")
    check.add_argument("--recipe-options", help="JSON object of the harbor recipe's options (image_map, ...)")
    build = sub.add_parser("build", help="build the tasks' environment/Dockerfile images (docker; no registry)")
    build.add_argument("dir", metavar="DIR", help="a Harbor dataset folder, or one task folder")
    build.add_argument(
        "--adapter",
        default="docker",
        choices=["docker", "kubernetes"],
        help="kubernetes: also import the images into the local one-node cluster's containerd",
    )
    build.add_argument("--recipe-options", help="JSON object of the harbor recipe's options (image_map, ...)")
    parser.set_defaults(func=main)
