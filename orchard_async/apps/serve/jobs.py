"""Commands as jobs, with Orchard's semantics, and the rule that a retry never runs twice.

The hazard (orchard-env-api.md section 4): Orchard's client POSTs ``/exec`` again after any
failure of its first attempt: the same body when the connection broke, the same body
*without* ``"wait"`` after any other error. Every one of those re-sends a command that
may already be running. So:

* A POST without ``"wait"`` is, from Orchard's client, only ever that fallback: it is
  answered with the latest job of the same command in the same sandbox that a ``wait``
  POST started and no fallback has claimed yet; only when there is none does it run.
* A POST identical to one whose caller hung up before its answer was delivered gets that
  job, not a new run (a caller who *received* an answer and sends the same command again
  means it: it runs again).
* ``Idempotency-Key`` (header): the same key from the same API key is the same job.
* ``X-Orchard-Retry: 1`` (the remote adapter's, on a retry of a POST whose connection broke
  after it was sent) with an ``Idempotency-Key`` this run of the service does not know, in a
  sandbox re-adopted after a restart: the first POST may have started the command in the run
  that died, so it is not run again; the answer is a failed job saying so.
* The ``wait`` answer always comes within ``timeout_seconds + 30`` s, complete; a job
  still queued or running by then is answered as such, with its ``job_id``, and the client
  polls instead of re-POSTing.
"""

from __future__ import annotations

import asyncio
import collections
import re
import secrets
import time
import uuid
from typing import Any

import msgspec

import orchard_async as oa
from orchard_async.apps.serve.lane import ENV_RESETS_SIGNALS, lane_for, usable_for
from orchard_async.apps.serve.registry import Box
from orchard_async.apps.serve.schema import ApiError, ExecRequest, b64decode, b64encode
from orchard_async.kit.shell import quote

DEFAULT_TIMEOUT = 300  # Orchard: timeout_seconds null
WAIT_MARGIN = 30.0  # the wait answer comes this long after the command's timeout at the latest
TIMEOUT_EXIT_CODE = 124
KEEP_FINISHED = 10_000  # finished jobs remembered for GET /jobs/{id}
RETRY_HORIZON = 600.0  # seconds during which a retry can still find its original
# Job ids begin with this process's own 8 hex digits: an id of the same shape with others is
# a job of an earlier run of the service, which a restart ended (see Jobs.lost_in_restart).
INSTANCE = secrets.token_hex(4)
JOB_ID = re.compile(r"[0-9a-f]{32}")
LOST_IN_RESTART = "the service restarted while this job ran; its outcome is unknown (run it again if that is safe)"


def lost_job(job_id: str, sandbox_id: str, command: str) -> dict[str, Any]:
    """A job object for a command the restart of the service cut: failed, outcome unknown."""
    return {
        "job_id": job_id,
        "sandbox_id": sandbox_id,
        "command": command,
        "status": "failed",
        "created_at": 0.0,
        "started_at": None,
        "completed_at": None,
        "stdout": "",
        "stderr": "",
        "exit_code": None,
        "error": LOST_IN_RESTART,
    }


class Job:
    def __init__(self, tenant: str, box: Box, request: ExecRequest, key: str | None):
        self.id = INSTANCE + uuid.uuid4().hex[:24]
        self.key = key
        self.tenant = tenant
        self.box = box
        self.request = request
        self.fingerprint = fingerprint(request)
        self.command = " ".join(request.command) if isinstance(request.command, list) else request.command
        self.status = "queued"
        self.created_at = time.time()
        self.started_at: float | None = None
        self.completed_at: float | None = None
        self.result: oa.ExecResult | None = None
        self.error: str | None = None
        self.done = asyncio.Event()
        self.waited = not isinstance(request.wait, msgspec.UnsetType)  # a first attempt, not a fallback
        self.claimed = False  # a fallback POST got this job already
        self.delivered = False  # its answer reached the caller who started it
        self.origin: Any = None  # that caller's connection (aiohttp's transport)

    @property
    def timeout(self) -> float | None:
        given = self.request.timeout_seconds
        if self.request.mode == "native":
            return given  # the library's meaning: None is no limit
        return given or DEFAULT_TIMEOUT

    def caller_gone(self) -> bool:
        return not self.delivered and (self.origin is None or self.origin.is_closing())

    def to_json(self) -> dict[str, Any]:
        result = self.result
        native = self.request.mode == "native"
        out: dict[str, Any] = {
            "job_id": self.id,
            "sandbox_id": self.box.id,
            "command": self.command,
            "status": self.status,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "stdout": "",
            "stderr": "",
            "exit_code": None,
            "error": self.error,
        }
        if result is not None:
            out["exit_code"] = result.exit_code
            if native:
                out.update(
                    stdout=b64encode(result.stdout),
                    stderr=b64encode(result.stderr),
                    encoding="base64",
                    reason=str(result.reason),
                    duration=result.duration,
                    stdout_cut=result.stdout_cut,
                    stderr_cut=result.stderr_cut,
                )
            else:
                out.update(stdout=result.text, stderr=result.error_text)
                if result.reason is oa.ExitReason.TIMEOUT:
                    out["exit_code"] = TIMEOUT_EXIT_CODE
                    out["stderr"] += f"Command timed out after {self.timeout:g}s and was killed\n"
        return out


# What Orchard's login shell runs before the command: ``bash --login`` reads the profile files
# but not ~/.bashrc, where images put their `conda activate`; the ``-i`` is what gets a
# bashrc past its usual "return unless interactive" guard.
SOURCE_BASHRC = "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi; "
# The two lines an interactive bash without a terminal starts with, which Orchard strips.
NO_JOB_CONTROL = re.compile(
    rb"\A(?:[^\n]*: cannot set terminal process group \([^\n]*\n|[^\n]*: no job control in this shell\n)"
)


def orchard_script(job: Job, default_signals: bool = False) -> str:
    """Orchard runs ``bash -c COMMAND`` (for a login shell ``bash --login -i -c``, sourcing
    ~/.bashrc first) in ``cwd``, and a cwd that does not exist becomes ``/``. Where the image has
    no bash, ``sh``. ``default_signals``: through ``env --default-signal``, since the shell the
    command is started from ignores SIGINT and SIGQUIT (as a background job) and a bash that
    inherits an ignored signal can never reset it: Orchard's commands start with none ignored."""
    request = job.request
    lines = []
    if request.cwd is not None:
        lines.append(f"cd -- {quote(job.box.path(request.cwd))} 2>/dev/null || cd /")
    if request.login_shell:
        bash = f"bash --login -i -c {quote(SOURCE_BASHRC + job.command)}"
        sh = f"sh -l -c {quote(job.command)}"
    else:
        bash, sh = f"bash -c {quote(job.command)}", f"sh -c {quote(job.command)}"
    run = "exec env --default-signal" if default_signals else "exec"
    lines.append(f"if command -v bash >/dev/null 2>&1; then {run} {bash}; else {run} {sh}; fi")
    return "\n".join(lines)


def without_tty_warnings(result: oa.ExecResult) -> oa.ExecResult:
    """A login shell's result without bash's two warnings about the terminal it lacks."""
    stderr = result.stderr
    while match := NO_JOB_CONTROL.match(stderr):
        stderr = stderr[match.end() :]
    return msgspec.structs.replace(result, stderr=stderr) if stderr is not result.stderr else result


def fingerprint(request: ExecRequest) -> bytes:
    """What makes two exec requests the same command (everything but ``wait``)."""
    fields = msgspec.structs.asdict(request)
    fields.pop("wait")
    return msgspec.json.encode(fields, order="sorted")


class Jobs:
    def __init__(self, metrics: Any, *, bash_lanes: bool = True):
        self.metrics = metrics
        self.bash_lanes = bash_lanes  # run Orchard commands in a bash lane where one can be had
        self.jobs: dict[str, Job] = {}
        self._finished: collections.deque[str] = collections.deque()
        self._by_idempotency: dict[tuple[str, str], Job] = {}
        # The latest jobs of each command in each sandbox: where a retry looks for its original.
        self._recent: dict[tuple[str, int, bytes], collections.deque[Job]] = {}

    @staticmethod
    def lost_in_restart(job_id: str, sandbox_id: str = "", command: str = "") -> dict[str, Any] | None:
        """The answer for a job of an earlier run of this service (its id has another
        instance's prefix): failed, since a restart ends every session's commands. The same
        for every key and for ids never handed out: it tells nobody anything."""
        if not JOB_ID.fullmatch(job_id) or job_id.startswith(INSTANCE):
            return None
        return lost_job(job_id, sandbox_id, command)

    @staticmethod
    def cut_by_restart(box: Box, request: ExecRequest) -> dict[str, Any]:
        """The answer to a retried POST whose first attempt may have run in the service's run
        before a restart (see the module docstring): its outcome is unknown."""
        command = " ".join(request.command) if isinstance(request.command, list) else request.command
        return lost_job("", box.id, command)

    def get(self, tenant: str, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            raise ApiError(404, f"job {job_id} not found", "unknown_job")
        return job

    # -- finding the original of a retry ---------------------------------------------------

    def original(self, tenant: str, box: Box, request: ExecRequest, key: str | None) -> Job | None:
        if key is not None:
            return self._by_idempotency.get((tenant, key))
        fallback = isinstance(request.wait, msgspec.UnsetType)
        horizon = time.time() - RETRY_HORIZON - (request.timeout_seconds or DEFAULT_TIMEOUT)
        for job in reversed(self._recent.get((tenant, id(box), fingerprint(request)), ())):
            if job.created_at < horizon:
                break
            if fallback and job.waited and not job.claimed:
                job.claimed = True
                return job
            if not fallback and job.caller_gone():
                return job
        return None

    # -- running -----------------------------------------------------------------------------

    def start(self, tenant: str, box: Box, request: ExecRequest, key: str | None, spawn) -> Job:
        if request.mode == "native" and request.stdin is not None:
            b64decode(request.stdin, "stdin")  # checked before anything runs
        if request.session is not None and request.session not in box.sessions:
            raise ApiError(404, f"session {request.session} not found", "unknown_session")
        job = Job(tenant, box, request, key)
        self.jobs[job.id] = job
        if key is not None:
            self._by_idempotency[(tenant, key)] = job
        recent = self._recent.setdefault((tenant, id(box), job.fingerprint), collections.deque(maxlen=4))
        recent.append(job)
        spawn(self._run(job))
        return job

    async def _run(self, job: Job) -> None:
        box, request = job.box, job.request
        try:
            if request.mode == "native":
                job.status, job.started_at = "running", time.time()
                job.result = await self._native(job)
            else:
                async with box.lock:
                    job.status, job.started_at = "running", time.time()
                    job.result = await self._orchard(job)
            self.metrics.observe_exec(time.time() - job.started_at)
            reason = job.result.reason
            job.status = "succeeded" if reason is oa.ExitReason.OK else "failed"
            if reason is oa.ExitReason.TIMEOUT:
                job.error = f"Command timed out after {job.timeout:g}s"
            elif reason.is_infra:
                job.error = f"{reason}: {job.result.error_text.strip()}"
                self.metrics.errors[str(reason)] += 1
        except oa.ConfigError as exc:
            job.status, job.error = "failed", f"invalid command: {exc}"
        except Exception as exc:  # noqa: BLE001 - a job reports its failure; the service goes on
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
            self.metrics.errors["exec_error"] += 1
        finally:
            job.completed_at = time.time()
            job.done.set()
            self._retire(job)

    async def _orchard(self, job: Job) -> oa.ExecResult:
        """``bash -c`` in the sandbox: in its bash lane where it has one (lane.py: a fork,
        not an exec of bash), else as a new bash process."""
        request, box = job.request, job.box
        lane = await lane_for(box) if self.bash_lanes and usable_for(request) else None
        if lane is None:
            sandbox = box.sandbox
            assert sandbox is not None  # a job starts only in a ready sandbox
            if box.default_signals is None:  # asked once per sandbox
                probe = await sandbox.exec(ENV_RESETS_SIGNALS, timeout=30)
                box.default_signals = probe.exit_code == 0
            script = orchard_script(job, box.default_signals)
            result = await sandbox.exec(script, timeout=job.timeout, env=request.env)
            return without_tty_warnings(result) if request.login_shell else result
        cwd = box.path(request.cwd) if request.cwd is not None else None
        return await lane.run(job.command, timeout=job.timeout, cwd=cwd, env=request.env)

    async def _native(self, job: Job) -> oa.ExecResult:
        request, box = job.request, job.box
        stdin = b64decode(request.stdin, "stdin") if request.stdin is not None else None
        if request.session is not None:
            _, session = box.sessions[request.session]
            return await session.exec(job.command, timeout=job.timeout, stdin=stdin)
        cwd = box.path(request.cwd) if request.cwd is not None else None
        return await box.sandbox.exec(job.command, timeout=job.timeout, cwd=cwd, env=request.env, stdin=stdin)

    def _retire(self, job: Job) -> None:
        """Forget the oldest finished jobs past KEEP_FINISHED."""
        self._finished.append(job.id)
        while len(self._finished) > KEEP_FINISHED:
            old = self.jobs.pop(self._finished.popleft(), None)
            if old is None:
                continue
            if old.key is not None:
                self._by_idempotency.pop((old.tenant, old.key), None)
            recent_key = (old.tenant, id(old.box), old.fingerprint)
            recent = self._recent.get(recent_key)
            if recent is not None and old in recent:
                recent.remove(old)
                if not recent:
                    del self._recent[recent_key]

    async def wait(self, job: Job, seconds: float | None) -> None:
        """Until the job ends or ``seconds`` pass (then it is answered as still running)."""
        if seconds is None:
            await job.done.wait()
            return
        if job.done.is_set():
            return
        try:
            async with asyncio.timeout(seconds):  # not wait_for: that runs the wait in a task of its own
                await job.done.wait()
        except TimeoutError:
            pass

    @staticmethod
    def wait_window(job: Job) -> float | None:
        timeout = job.timeout
        return None if timeout is None else timeout + WAIT_MARGIN
