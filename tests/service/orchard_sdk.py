"""A stand-in for Orchard Env's Python client (``orchard_env``), which is not on PyPI: the
request shapes, parsing and retry rules of orchard-env-api.md, sync (requests) and async
(aiohttp, whose ``response.json()`` insists on ``application/json``). Every call of the
client's sandbox API as of Orchard 8cc370a (orchard_env/client/sandbox_client.py) but the
network ones and ``pty=True`` (test_pty.py speaks that protocol): create (with and without
waiting), get, delete, health, exec (waited, not waited, login shell), get_job, files
(content and local paths, list with its default "/"), apply_patch, heartbeat and check_env's
two probes; each rule cites its section of the contract file."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import requests

TERMINAL = ("succeeded", "failed")

# check_env's probes: a plain shell's PATH and HISTCONTROL, then a login shell's, with whether a
# ~/.bashrc exists (it counts as loaded when the login shell's environment differs).
BARE_PROBE = 'echo "PATH=$PATH"; echo "HISTCONTROL=${HISTCONTROL:-}"'
LOGIN_PROBE = (
    BARE_PROBE
    + '; echo "BASHRC=$([ -f ~/.bashrc ] && echo yes || echo no)"; echo "PYTHON=$(command -v python3 || echo none)"'
)


def probe_values(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def environment_check(bare: JobResult, login: JobResult) -> dict[str, Any]:
    plain, full = probe_values(bare.stdout), probe_values(login.stdout)
    has_bashrc = full.get("BASHRC") == "yes"
    changed = (plain.get("PATH"), plain.get("HISTCONTROL")) != (full.get("PATH"), full.get("HISTCONTROL"))
    return {"has_bashrc": has_bashrc, "bashrc_loaded": has_bashrc and changed, "path": full.get("PATH", ""),
            "bare_path": plain.get("PATH", ""), "python3": full.get("PYTHON", "none"), "stderr": login.stderr}  # fmt: skip


@dataclass
class JobResult:
    """Section 4: needs job_id, sandbox_id, command, status, created_at; reads the rest."""

    job_id: str
    sandbox_id: str
    command: str
    status: str
    created_at: float
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, data: dict[str, Any]) -> JobResult:
        return cls(
            data["job_id"], data["sandbox_id"], data["command"], data["status"], float(data["created_at"]),
            data.get("stdout", ""), data.get("stderr", ""), data.get("exit_code"), data.get("error"), data,
        )  # fmt: skip

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


def exec_body(command: str | list[str], timeout: int | None, cwd: str | None, env: dict | None, login: bool) -> dict:
    """Section 2 (probe): every key always present, ``wait`` true."""
    return {"command": command, "timeout_seconds": timeout, "cwd": cwd, "env": env, "login_shell": login, "wait": True}


def create_body(image: str, block_network: bool, sandbox_id: str | None, prefix: str | None, **given: Any) -> dict:
    body: dict[str, Any] = {"image": image, "block_network": block_network}
    if prefix:
        sandbox_id = f"{prefix}-{sandbox_id or uuid.uuid4().hex[:8]}"
    if sandbox_id:
        body["sandbox_id"] = sandbox_id
    body.update({key: value for key, value in given.items() if value})  # only when given/truthy
    return body


def ready_or_raise(data: dict[str, Any]) -> bool:
    """Section 2, /wait: ready (truthy) or status ready -> done; failed -> RuntimeError."""
    if data.get("ready") or data.get("status") == "ready":
        return True
    if data.get("status") == "failed":
        raise RuntimeError(data.get("status_message"))
    return False


# -- sync --------------------------------------------------------------------------------------


class SandboxClient:
    def __init__(self, base_url: str, api_key: str | None = None, sandbox_prefix: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["X-API-Key"] = api_key
        self.prefix = sandbox_prefix
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, timeout: float = 1200, **options: Any) -> Any:
        """Section 1: 503 retried after Retry-After, connection errors retried, 3 attempts in all."""
        for attempt in range(3):
            self.calls.append((method, path))
            try:
                response = self.session.request(method, self.base_url + path, timeout=timeout, **options)
            except (requests.ConnectionError, requests.Timeout):
                if attempt == 2:
                    raise
                time.sleep(attempt + 1)
                continue
            if response.status_code == 503 and attempt < 2:
                time.sleep(float(response.headers.get("Retry-After", 1)))
                continue
            response.raise_for_status()
            return response.json()
        raise AssertionError("unreachable")

    def health(self) -> Any:
        return self.request("GET", "/health")

    def create_sandbox(self, image: str, block_network: bool = True, sandbox_id: str | None = None, *,
                       cpu: str | None = None, memory: str | None = None, timeout: int | None = None) -> Sandbox:  # fmt: skip
        body = create_body(image, block_network, sandbox_id, self.prefix, cpu=cpu, memory=memory, timeout=timeout)
        made = self.request("POST", "/sandboxes", json=body)
        sandbox_id = made["sandbox_id"]
        try:
            data = self.request("GET", f"/sandboxes/{sandbox_id}/wait", params={"timeout": made.get("timeout", 3600)})
        except requests.HTTPError as exc:
            if exc.response.status_code == 408:
                self.request("DELETE", f"/sandboxes/{sandbox_id}")
                raise TimeoutError(sandbox_id) from None
            raise
        if not ready_or_raise(data):
            raise RuntimeError(f"sandbox {sandbox_id}: {data.get('status')}")
        data["namespace"], data["image"], data["block_network"]  # noqa: B018 - read as the instance data
        return Sandbox(self, sandbox_id)

    def get_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        data = self.request("GET", f"/sandboxes/{sandbox_id}")
        data["sandbox_id"]  # noqa: B018 - needed
        return data

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """The client's get_sandbox: an instance for an existing sandbox."""
        return Sandbox(self, self.get_sandbox(sandbox_id)["sandbox_id"])

    def create_unwaited(self, image: str, block_network: bool = True) -> Sandbox:
        """create_sandbox(wait_ready=False): the create's answer, no /wait."""
        made = self.request("POST", "/sandboxes", json=create_body(image, block_network, None, self.prefix))
        return Sandbox(self, made["sandbox_id"])

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Errors ignored, as the client's cleanup does."""
        try:
            self.request("DELETE", f"/sandboxes/{sandbox_id}")
        except requests.RequestException:
            pass

    def get_job(self, job_id: str) -> JobResult:
        return JobResult.of(self.request("GET", f"/jobs/{job_id}"))


class Sandbox:
    def __init__(self, client: SandboxClient, sandbox_id: str):
        self.client = client
        self.id = sandbox_id

    def exec(self, command: str | list[str], timeout: int | None = None, cwd: str | None = None,
             env: dict | None = None, login_shell: bool = False, wait: bool = True) -> JobResult:  # fmt: skip
        body = exec_body(command, timeout, cwd, env, login_shell)
        path = f"/sandboxes/{self.id}/exec"
        try:
            data = self.client.request("POST", path, json=body, timeout=(timeout or 300) + 60)
            job = JobResult.of(data) if data.get("status") in TERMINAL else None
            job_id = job.job_id if job else data["job_id"]
        except Exception:  # section 4: any exception -> the same POST without "wait"
            data = self.client.request("POST", path, json={k: v for k, v in body.items() if k != "wait"})
            job, job_id = None, data["job_id"]
        if not wait and job is None:  # the client makes up a queued job for the caller to poll
            return JobResult(job_id, self.id, str(command), "queued", time.time())
        deadline = time.monotonic() + (timeout or 300) + 60
        while job is None or job.status not in TERMINAL:
            if time.monotonic() > deadline:
                raise TimeoutError(job_id)
            time.sleep(0.1)
            job = self.client.get_job(job_id)
        return job

    def upload_content(self, data: bytes, remote: str) -> Any:
        body = {"path": remote, "content": base64.b64encode(data).decode()}
        return self.client.request("POST", f"/sandboxes/{self.id}/files", json=body)

    def upload_file(self, local: str, remote: str) -> Any:
        with open(local, "rb") as source:
            return self.upload_content(source.read(), remote)

    def download_content(self, remote: str) -> bytes:
        data = self.client.request("GET", f"/sandboxes/{self.id}/files", params={"path": remote})
        return base64.b64decode(data["content"])

    def download_file(self, remote: str, local: str) -> int:
        data = self.download_content(remote)
        with open(local, "wb") as target:
            target.write(data)
        return len(data)

    def get_job(self, job_id: str) -> JobResult:
        return self.client.get_job(job_id)

    def check_env(self) -> dict[str, Any]:
        return environment_check(
            self.exec(BARE_PROBE, timeout=10), self.exec(LOGIN_PROBE, timeout=15, login_shell=True)
        )

    def list_files(self, remote: str = "/") -> list:
        return self.client.request("GET", f"/sandboxes/{self.id}/files/list", params={"path": remote})["files"]

    def apply_patch(self, patch: str, timeout: int = 30) -> dict:
        body = {"patch": patch, "timeout_seconds": timeout}
        return self.client.request("POST", f"/sandboxes/{self.id}/apply_patch", json=body)

    def heartbeat(self) -> None:
        self.client.request("POST", f"/sandboxes/{self.id}/heartbeat")

    def delete(self) -> Any:
        return self.client.request("DELETE", f"/sandboxes/{self.id}")


# -- async -------------------------------------------------------------------------------------


class AsyncSandboxClient:
    def __init__(self, base_url: str, api_key: str | None = None):
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        headers = {"X-API-Key": api_key} if api_key else {}
        timeout = aiohttp.ClientTimeout(total=1200, sock_connect=30, sock_read=1200)
        self.session = aiohttp.ClientSession(headers=headers, timeout=timeout)
        self.tracked: set[str] = set()

    async def request(self, method: str, path: str, **options: Any) -> Any:
        for attempt in range(3):
            try:
                async with self.session.request(method, self.base_url + path, **options) as response:
                    if response.status == 503 and attempt < 2:
                        await asyncio.sleep(float(response.headers.get("Retry-After", 1)))
                        continue
                    response.raise_for_status()
                    return await response.json()  # ContentTypeError unless application/json
            except (TimeoutError, aiohttp.ClientConnectionError):
                if attempt == 2:
                    raise
                await asyncio.sleep(attempt + 1)
        raise AssertionError("unreachable")

    async def create_sandbox(
        self, image: str, block_network: bool = True, sandbox_id: str | None = None
    ) -> AsyncSandbox:
        made = await self.request("POST", "/sandboxes", json=create_body(image, block_network, sandbox_id, None))
        sandbox_id = made["sandbox_id"]
        self.tracked.add(sandbox_id)
        wait_timeout = made.get("timeout", 3600)
        data = await self.request(
            "GET", f"/sandboxes/{sandbox_id}/wait", params={"timeout": wait_timeout},
            timeout=aiohttp.ClientTimeout(total=wait_timeout + 30),
        )  # fmt: skip
        if not ready_or_raise(data):
            raise RuntimeError(sandbox_id)
        return AsyncSandbox(self, sandbox_id)

    async def health(self) -> Any:
        return await self.request("GET", "/health")

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        data = await self.request("GET", f"/sandboxes/{sandbox_id}")
        return AsyncSandbox(self, data["sandbox_id"])

    async def delete_sandbox(self, sandbox_id: str) -> None:
        """Errors ignored, as the client's cleanup does."""
        self.tracked.discard(sandbox_id)
        try:
            await self.request("DELETE", f"/sandboxes/{sandbox_id}")
        except aiohttp.ClientError:
            pass

    async def get_job(self, job_id: str) -> JobResult:
        return JobResult.of(await self.request("GET", f"/jobs/{job_id}"))

    async def close(self) -> None:
        """Section 3: async close() DELETEs every tracked sandbox."""
        for sandbox_id in list(self.tracked):
            await self.request("DELETE", f"/sandboxes/{sandbox_id}")
            self.tracked.discard(sandbox_id)
        await self.session.close()


class AsyncSandbox:
    def __init__(self, client: AsyncSandboxClient, sandbox_id: str):
        self.client = client
        self.id = sandbox_id

    async def exec(self, command: str | list[str], timeout: int | None = None, cwd: str | None = None,
                   env: dict | None = None, login_shell: bool = False, wait: bool = True) -> JobResult:  # fmt: skip
        body = exec_body(command, timeout, cwd, env, login_shell)
        path = f"/sandboxes/{self.id}/exec"
        try:
            data = await self.client.request("POST", path, json=body)
        except Exception:  # section 4
            data = await self.client.request("POST", path, json={k: v for k, v in body.items() if k != "wait"})
        if not wait and data.get("status") not in TERMINAL:
            return JobResult(data["job_id"], self.id, str(command), "queued", time.time())
        while data.get("status") not in TERMINAL:
            await asyncio.sleep(0.1)
            data = await self.client.request("GET", f"/jobs/{data['job_id']}")
        return JobResult.of(data)

    async def upload_content(self, data: bytes, remote: str) -> Any:
        body = {"path": remote, "content": base64.b64encode(data).decode()}
        return await self.client.request("POST", f"/sandboxes/{self.id}/files", json=body)

    async def download_content(self, remote: str) -> bytes:
        data = await self.client.request("GET", f"/sandboxes/{self.id}/files", params={"path": remote})
        return base64.b64decode(data["content"])

    async def upload_file(self, local: str, remote: str) -> Any:
        with open(local, "rb") as source:  # noqa: ASYNC230 - the client's own way
            return await self.upload_content(source.read(), remote)

    async def download_file(self, remote: str, local: str) -> int:
        data = await self.download_content(remote)
        with open(local, "wb") as target:  # noqa: ASYNC230 - the client's own way
            target.write(data)
        return len(data)

    async def get_job(self, job_id: str) -> JobResult:
        return await self.client.get_job(job_id)

    async def check_env(self) -> dict[str, Any]:
        bare = await self.exec(BARE_PROBE, timeout=10)
        return environment_check(bare, await self.exec(LOGIN_PROBE, timeout=15, login_shell=True))

    def delete_sync(self) -> None:
        """The client's delete for a closed event loop: a plain DELETE, errors ignored."""
        headers = {"X-API-Key": self.client.api_key} if self.client.api_key else {}
        try:
            requests.delete(f"{self.client.base_url}/sandboxes/{self.id}", headers=headers, timeout=10)
        except requests.RequestException:
            pass
        self.client.tracked.discard(self.id)

    async def list_files(self, remote: str = "/") -> list:
        return (await self.client.request("GET", f"/sandboxes/{self.id}/files/list", params={"path": remote}))["files"]

    async def apply_patch(self, patch: str, timeout: int = 30) -> dict:
        body = {"patch": patch, "timeout_seconds": timeout}
        return await self.client.request("POST", f"/sandboxes/{self.id}/apply_patch", json=body)

    async def heartbeat(self) -> Any:
        return await self.client.request("POST", f"/sandboxes/{self.id}/heartbeat")

    async def delete(self) -> Any:
        answer = await self.client.request("DELETE", f"/sandboxes/{self.id}")
        self.client.tracked.discard(self.id)
        return answer
