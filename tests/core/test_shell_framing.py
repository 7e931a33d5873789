"""The shell-session framing: property tests against a real server and a scripted one."""

from __future__ import annotations

import contextlib
import os
import signal

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.kit.shell import ShellClient, classify, quote

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
async def box():
    adapter = LocalAdapter()
    sandbox = await adapter.create(oa.SandboxSpec(ttl=600))
    yield sandbox
    await adapter.close()


@SETTINGS
@given(out=st.binary(max_size=3000), err=st.binary(max_size=3000), code=st.integers(0, 255))
async def test_any_bytes_and_exit_code_round_trip(box, out: bytes, err: bytes, code: int) -> None:
    await box.write_file("err.bin", err)
    result = await box.exec(f"cat; cat err.bin >&2; exit {code}", stdin=out)
    assert (result.stdout, result.stderr, result.exit_code) == (out, err, code)
    assert result.reason is classify(code, timed_out=False)


@SETTINGS
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=300))
async def test_any_command_text_survives_quoting(box, text: str) -> None:
    result = await box.exec(f"printf %s {quote(text)}")
    assert result.stdout == text.encode()


async def test_text_that_is_not_utf8_is_a_clear_error(box) -> None:
    with pytest.raises(oa.ConfigError, match="surrogate"):
        await box.exec("echo \ud800")
    assert (await box.exec("echo fine")).ok


class ScriptedServer(anyio.abc.ByteStream):
    """Plays a server: answers each frame with the bytes a test makes from its nonce."""

    def __init__(self, replies: list):
        self.replies = replies
        self.inbox: list[bytes] = [b"@@READY 7\n"]

    async def send(self, item: bytes) -> None:
        if item.startswith(b"_o_x "):
            nonce = item.split()[1]
            self.inbox.append(self.replies.pop(0)(nonce))

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.inbox:
            raise anyio.EndOfStream
        return self.inbox.pop(0)

    async def send_eof(self) -> None: ...

    async def aclose(self) -> None: ...


async def _never(client: ShellClient) -> None:
    raise AssertionError("no interrupt expected")


@given(out=st.binary(max_size=500), code=st.integers(0, 255))
@settings(max_examples=100, deadline=None)
async def test_output_that_looks_like_frames_is_just_data(out: bytes, code: int) -> None:
    def reply(nonce: bytes) -> bytes:
        fake = b"@@ORCH %s 0 0 1 1\nx@@END %s\n" % (nonce, nonce) + out
        return b"@@ORCH %s %d 0 %d 0\n" % (nonce, code, len(fake)) + fake + b"@@END %s\n" % nonce

    client = ShellClient(ScriptedServer([reply]), workdir="/w", interrupt=_never)
    await client.start("/ctl")
    result = await client.run("anything")
    assert result.stdout.endswith(b"x@@END " + result.stdout.split()[1] + b"\n" + out)
    assert (result.exit_code, result.reason.is_infra) == (code, False)


async def test_a_desynchronised_server_counts_as_lost() -> None:
    client = ShellClient(
        ScriptedServer([lambda nonce: b"@@ORCH deadbeef 0 0 0 0\n@@END deadbeef\n"]), workdir="/w", interrupt=_never
    )
    await client.start("/ctl")
    result = await client.run("true")
    assert result.reason is oa.ExitReason.SANDBOX_LOST
    assert (await client.run("true")).reason is oa.ExitReason.SANDBOX_LOST


def _signal_sandbox(adapter: LocalAdapter, sandbox_id: str, signum: int) -> None:
    """Signal every process of a local sandbox (its shell among them) from outside it."""
    from orchard_async.adapters.local import _sandbox_processes

    (pids,) = [pids for where, pids in _sandbox_processes().items() if where.endswith(sandbox_id)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


async def test_a_ping_needs_the_shell_to_answer_and_a_late_answer_never_reaches_a_command() -> None:
    """The warm pool's check: the shell answers a ping itself; a stopped shell does not (the
    ping times out), and its answer, when it comes later, is not taken for a command's; a
    killed shell fails the ping and the client is lost."""
    async with LocalAdapter() as adapter:
        box = await adapter.create(oa.SandboxSpec(ttl=600))
        assert await box.ping(5)
        _signal_sandbox(adapter, box.id, signal.SIGSTOP)
        assert not await box.ping(0.3)
        _signal_sandbox(adapter, box.id, signal.SIGCONT)
        for word in ("one", "two"):
            result = await box.exec(f"echo {word}")
            assert (result.stdout, result.exit_code) == (f"{word}\n".encode(), 0)
        assert await box.ping(5)
        _signal_sandbox(adapter, box.id, signal.SIGKILL)
        assert not await box.ping(5)
        assert (await box.exec("echo late")).reason is oa.ExitReason.SANDBOX_LOST
