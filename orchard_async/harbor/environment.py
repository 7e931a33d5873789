"""``OrchardEnvironment``: Harbor's ``BaseEnvironment`` over an orchard-async adapter.

    harbor run -p TASKS -a oracle -e orchard_async.harbor:OrchardEnvironment \\
        --ek adapter=docker --ek 'image_map={"ubuntu:24.04": "orchard/bookworm:min"}'

Options (``--ek``, ``OrchardEnvironmentOptions``): ``adapter`` (default docker),
``adapter_options`` (a JSON object, as ``--adapter-options``), ``image_map`` (the images a
task names -> local ones; no registry is reached). The environment's image is the task's
``docker_image`` or its ``Dockerfile`` built on this machine with docker (the docker and
kubernetes adapters; the Harbor recipe's ``images``), on kubernetes imported into the local
one-node cluster's containerd; on an adapter that runs no image (local), the Dockerfile's
steps are replayed in the sandbox. Capabilities are the adapter's: no-network on every adapter here;
allowlists and switching the policy between phases only where sandboxes switch egress
(``capabilities.NetworkControl``); no GPUs, no host mounts, no compose.
"""

from __future__ import annotations

import io
import json
import posixpath
import shlex
import tarfile
import threading
from pathlib import Path
from typing import Any

import anyio
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from pydantic import Field, field_validator

from orchard_async import SandboxSpec, capabilities
from orchard_async.recipes.harbor import images
from orchard_async.recipes.harbor.task import apply_network, writable_dirs
from orchard_async.runtime import get_adapter

# Adapters whose sandboxes can switch egress once the library has it (capabilities.NetworkControl).
SWITCHING_ADAPTERS = ("docker", "kubernetes", "local")
CONTAINER_ADAPTERS = ("docker", "kubernetes")  # the image is built here with docker
_BUILDING = threading.Lock()  # builds and imports of this process, one at a time
TRANSFER = "/tmp/.orchard-harbor-transfer.tgz"
TTL = 24 * 3600.0  # a trial ends its sandbox with stop(); this only bounds one a crash left


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ValueError(f"{name} must be a JSON object") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object")
    return value


def _read(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mode & 0o777 | 0o600


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _extract(packed: bytes, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        tar.extractall(target, filter="data")  # the sandbox's tar: nothing may leave target


class OrchardEnvironmentOptions(EnvironmentOptions):
    adapter: str = Field(default="docker", description="the orchard-async adapter (docker, local, kubernetes, remote)")
    adapter_options: dict[str, Any] = Field(default_factory=dict, description="the adapter's options (JSON)")
    image_map: dict[str, str] = Field(default_factory=dict, description="task images -> local images (JSON)")

    @field_validator("adapter_options", mode="before")
    @classmethod
    def _adapter_options(cls, value: Any) -> dict[str, Any]:
        return _mapping(value, "adapter_options")

    @field_validator("image_map", mode="before")
    @classmethod
    def _image_map(cls, value: Any) -> dict[str, Any]:
        return _mapping(value, "image_map")


class OrchardEnvironment(BaseEnvironment):
    options_model = OrchardEnvironmentOptions

    def __init__(self, *args: Any, **kwargs: Any):
        self._adapter: Any = None
        self._sandbox: Any = None
        self._replay_env: dict[str, str] = {}
        self._replay_workdir: str | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "orchard-async"

    @property
    def _opts(self) -> OrchardEnvironmentOptions:
        assert isinstance(self.options, OrchardEnvironmentOptions)
        return self.options

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        adapter = self._opts.adapter if getattr(self, "options", None) is not None else "docker"
        switches = hasattr(capabilities, "NetworkControl") and adapter in SWITCHING_ADAPTERS
        return EnvironmentCapabilities(
            disable_internet=adapter != "sim",
            network_allowlist=switches,
            network_allowlist_ipv4_addresses=switches,
            network_allowlist_ipv6_addresses=switches,
            network_allowlist_ipv4_cidrs=switches,
            network_allowlist_ipv6_cidrs=switches,
            network_allowlist_hostnames=switches,  # resolved to addresses when applied
            dynamic_network_policy=switches,
        )

    def _validate_definition(self) -> None:
        if not self.task_env_config.docker_image and not (self.environment_dir / "Dockerfile").is_file():
            raise FileNotFoundError(f"{self.environment_dir}: no Dockerfile and no [environment].docker_image")

    # -- lifetime --------------------------------------------------------------------------

    def _image(self) -> str | None:
        """The task's image, built with docker for the container adapters (as ``orchard-async
        harbor build`` does) and, for kubernetes, imported into the one-node cluster's
        containerd, where its pods find it (``harbor build --adapter kubernetes``)."""
        image_map = self._opts.image_map
        adapter = self._opts.adapter
        if self.task_env_config.docker_image:
            tag = images.mapped(self.task_env_config.docker_image, image_map)
        else:
            tag = images.built_tag(self.environment_name, self.environment_dir, image_map)
            if adapter in CONTAINER_ADAPTERS:
                with _BUILDING:  # trials of one task start at once: one build, the others find it
                    images.build(tag, self.environment_dir, image_map, timeout=self.task_env_config.build_timeout_sec)
        if adapter == "kubernetes":
            with _BUILDING:
                images.import_into_containerd(tag, images.cluster_containerd())
        return tag

    def _spec(self) -> SandboxSpec:
        config = self.task_env_config
        return SandboxSpec(
            image=self._image(),
            cpu=float(self._effective_cpus) if self._effective_cpus else None,
            memory=f"{self._effective_memory_mb}Mi" if self._effective_memory_mb else None,
            network="on" if self._always_public else "none",
            workdir=config.workdir,
            env=self._startup_env(),
            ttl=TTL,
            labels={"orchard.harbor": "environment"},
            pull="never",
            # Harbor's runner may run any phase as another user of the image (exec(user=...)).
            switch_users=True,
            **self._writable_dirs(),
        )

    def _writable_dirs(self) -> dict[str, Any]:
        """Harbor's absolute dirs (and a replayed Dockerfile's) where no image made them (local)."""
        dirs = ["/logs", "/tests", "/solution", "/installed-agent"]
        if self.task_env_config.workdir:
            dirs.append(self.task_env_config.workdir)
        plan = images.replay_plan(self.environment_dir)
        dirs += [
            d
            for d in [plan.workdir, *(dest for kind, _, dest in plan.steps if kind == "copy")]
            if d and d.startswith("/")
        ]
        return {"writable_dirs": writable_dirs(dirs)}

    @property
    def _always_public(self) -> bool:
        """Online at creation only when every phase is: a sandbox switches from offline (local
        cannot switch one made online)."""
        return all(p.network_mode == NetworkMode.PUBLIC for p in [self._network_policy, *self._phase_network_policies])

    async def start(self, force_build: bool) -> None:
        # A built image is keyed by its context's digest: a changed context is a new image, so
        # force_build has nothing more to do.
        self._adapter = get_adapter(self._opts.adapter, **self._opts.adapter_options)
        # builds and imports block: in a thread, so the runner's other trials go on
        self._sandbox = await self._adapter.create(await anyio.to_thread.run_sync(self._spec))
        workdir = shlex.quote(self.task_env_config.workdir) if self.task_env_config.workdir else ""
        await self._must(f"mkdir -p /logs/agent /logs/verifier /logs/artifacts {workdir} && chmod 777 /logs/agent "
                         "/logs/verifier /logs/artifacts", "creating Harbor's directories")  # fmt: skip
        if (self.environment_dir / "Dockerfile").is_file() and not self.task_env_config.docker_image:
            marker = await self._sandbox.exec(f"cat {images.MARKER}", timeout=30)
            if not marker.ok:
                await self._replay()
        if not self._always_public and self._network_policy.network_mode != NetworkMode.NO_NETWORK:
            await self._apply_network_policy(self._network_policy)
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        try:
            if self._sandbox is not None:
                await self._sandbox.close()
        finally:
            self._sandbox = None
            if self._adapter is not None:
                await self._adapter.close()
                self._adapter = None

    async def _must(self, command: str, what: str) -> None:
        result = await self._sandbox.exec(command, timeout=300)
        if not result.ok:
            raise RuntimeError(f"{what} failed: {(result.error_text or result.text).strip()[-300:]}")

    async def _replay(self) -> None:
        """What the Dockerfile does, in a sandbox that did not run its image (local)."""
        plan = images.replay_plan(self.environment_dir)
        self._replay_env = dict(plan.env)
        self._replay_workdir = plan.workdir
        for kind, first, second in plan.steps:
            if kind == "run":
                exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in plan.env.items())
                await self._must(f"{exports}cd {shlex.quote(second)} && {first}", f"Dockerfile RUN {first[:60]!r}")
                continue
            source = self.environment_dir / first
            target = second if second.startswith("/") else posixpath.join(plan.workdir or "/", second)
            if source.is_dir():
                await self.upload_dir(source, target)
            else:
                await self.upload_file(source, posixpath.join(target, source.name) if target.endswith("/") else target)

    # -- commands and files ------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        merged = {**self._replay_env, **(self._merge_env(env) or {})}
        where = cwd or self.task_env_config.workdir or self._replay_workdir
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in merged.items())
        body = f"{exports}{f'cd {shlex.quote(where)} && ' if where else ''}{command}"
        who = self._resolve_user(user)
        if who is not None and str(who) not in ("root", "0"):
            # Root switches; a sandbox of one unprivileged user (local) runs it as that user.
            body = f'if [ "$(id -u)" = 0 ]; then su -s /bin/sh {shlex.quote(str(who))} -c {shlex.quote(body)}; ' \
                   f"else sh -c {shlex.quote(body)}; fi"  # fmt: skip
        result = await self._sandbox.exec(body, timeout=float(timeout_sec) if timeout_sec else None)
        if result.reason.value == "timeout":
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        if result.reason.is_infra:
            raise RuntimeError(f"the sandbox was lost: {result.error_text.strip()}")
        return ExecResult(stdout=result.text, stderr=result.error_text, return_code=result.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data, mode = _read(Path(source_path))
        await self._must(f"mkdir -p {shlex.quote(posixpath.dirname(target_path) or '/')}", "mkdir for an upload")
        await self._sandbox.write_file(target_path, data, mode=mode)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(str(source_dir), arcname=".")
        await self._sandbox.write_file(TRANSFER, buffer.getvalue(), mode=0o600)
        target = shlex.quote(target_dir)
        await self._must(f"mkdir -p {target} && tar xzf {TRANSFER} -C {target} --no-same-owner; rc=$?; rm -f {TRANSFER}; "
                         f"exit $rc", f"unpacking into {target_dir}")  # fmt: skip

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        _write(Path(target_path), await self._sandbox.read_file(source_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        source = shlex.quote(source_dir)
        await self._must(f"tar czf {TRANSFER} -C {source} .", f"packing {source_dir}")
        data = await self._sandbox.read_file(TRANSFER)
        await self._sandbox.exec(f"rm -f {TRANSFER}", timeout=30)
        _extract(data, Path(target_dir))

    # -- network -----------------------------------------------------------------------------

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        from orchard_async.recipes.harbor.config import Network

        mode = network_policy.network_mode.value
        await apply_network(self._sandbox, Network(mode, tuple(network_policy.allowed_hosts)))
