"""Exec semantics every adapter must share."""

from __future__ import annotations

import os

import pytest

import orchard_async as oa
from orchard_async import ExitReason


async def test_exit_codes_and_reasons(sandbox: oa.Sandbox) -> None:
    ok = await sandbox.exec("true")
    assert (ok.exit_code, ok.reason) == (0, ExitReason.OK)
    for code in (1, 3, 255):
        result = await sandbox.exec(f"exit {code}")
        assert (result.exit_code, result.reason) == (code, ExitReason.NONZERO)


async def test_stdout_and_stderr_are_separate(sandbox: oa.Sandbox) -> None:
    result = await sandbox.exec("echo out; echo err >&2; echo out2")
    assert result.stdout == b"out\nout2\n"
    assert result.stderr == b"err\n"


async def test_binary_output_is_byte_exact(sandbox: oa.Sandbox) -> None:
    payload = bytes(range(256)) * 4 + os.urandom(4096)
    await sandbox.write_file("blob.bin", payload)
    result = await sandbox.exec("cat blob.bin")
    assert result.ok and result.stdout == payload


async def test_stdin_is_eof_unless_given(sandbox: oa.Sandbox) -> None:
    result = await sandbox.exec("cat", timeout=10)
    assert result.ok and result.stdout == b""
    assert (await sandbox.exec("read line", timeout=10)).reason is ExitReason.NONZERO
    given = await sandbox.exec("cat", stdin=b"line one\n\x00\xff", timeout=10)
    assert given.stdout == b"line one\n\x00\xff"


async def test_cwd_and_env(sandbox: oa.Sandbox) -> None:
    await sandbox.exec("mkdir -p sub/dir")
    assert (await sandbox.exec("pwd", cwd="sub/dir")).text.strip().endswith("/sub/dir")
    result = await sandbox.exec('printf %s "$GREETING"', env={"GREETING": 'it\'s a "test" $HOME'})
    assert result.text == 'it\'s a "test" $HOME'


async def test_quoting_survives_any_text(sandbox: oa.Sandbox) -> None:
    tricky = "a'b\"c`d$e\\f\ng @@ORCH 1 2 3 4 5 @@END x\n'"
    result = await sandbox.exec("cat", stdin=tricky.encode())
    assert result.text == tricky
    assert (await sandbox.exec(f"printf %s {oa_quote(tricky)}")).text == tricky


def oa_quote(text: str) -> str:
    from orchard_async.kit.shell import quote

    return quote(text)


async def test_timeout_kills_the_process_tree(sandbox: oa.Sandbox) -> None:
    result = await sandbox.exec("sleep 300 & echo $! > bg.pid; sleep 300", timeout=1)
    assert result.reason is ExitReason.TIMEOUT
    assert result.duration < 20
    # A killed process whose parent died too is a zombie until the namespace's init reaps it,
    # which can lag under load; `kill -0` still succeeds on a zombie, its state says it is dead.
    # SIGKILL takes effect when the process next runs: on a loaded machine it may still show
    # as running for a moment, so it has 5 s to be gone.
    alive = await sandbox.exec(
        'p=$(cat bg.pid); n=0; while :; do s=gone; while read -r k v; do [ "$k" = State: ] && s=$v; done '
        '</proc/$p/status 2>/dev/null; case "$s" in gone|Z*) echo gone; break ;; esac; '
        'n=$((n+1)); [ $n -ge 50 ] && { echo "alive: $s"; break; }; sleep 0.1; done'
    )
    assert alive.text.strip() == "gone"
    assert (await sandbox.exec("echo still usable")).text == "still usable\n"


async def test_background_process_survives_a_finished_command(sandbox: oa.Sandbox) -> None:
    await sandbox.exec("sleep 300 >/dev/null 2>&1 & echo $! > bg.pid")
    assert (await sandbox.exec("kill -0 $(cat bg.pid) && echo alive")).text.strip() == "alive"


async def test_output_cap_keeps_head_and_tail(make_adapter) -> None:
    adapter = make_adapter(output_cap=1000)
    box = await adapter.create(oa.SandboxSpec(ttl=120))
    try:
        result = await box.exec("i=0; while [ $i -lt 300 ]; do printf '%09d\\n' $i; i=$((i+1)); done")
        assert result.stdout_cut == 3000 - 1000
        assert result.stdout.startswith(b"000000000\n000000001\n")
        assert result.stdout.endswith(b"000000298\n000000299\n")
        assert b"[orchard: 2000 bytes cut]" in result.stdout
        small = await box.exec("echo small >&2")
        assert (small.stderr, small.stderr_cut) == (b"small\n", 0)
    finally:
        await box.close()


async def test_bad_input_is_rejected_before_running(sandbox: oa.Sandbox) -> None:
    with pytest.raises(oa.ConfigError, match="timeout"):
        await sandbox.exec("touch should-not-exist", timeout=-1)
    with pytest.raises(oa.ConfigError, match="NUL"):
        await sandbox.exec("touch should-not-exist\0")
    with pytest.raises(oa.ConfigError, match="environment variable"):
        await sandbox.exec("touch should-not-exist", env={"BAD NAME": "x"})
    assert (await sandbox.exec("ls should-not-exist")).reason is ExitReason.NONZERO


async def test_session_keeps_state_and_exec_does_not(sandbox: oa.Sandbox) -> None:
    await sandbox.exec("mkdir -p deep/er")
    async with sandbox.session() as shell:
        await shell.exec("cd deep/er; COUNT=41; export EXPORTED=yes")
        await shell.exec("COUNT=$((COUNT + 1))")
        result = await shell.exec('echo "$PWD $COUNT $EXPORTED"')
        assert result.text.strip().endswith("/deep/er 42 yes")
        timed_out = await shell.exec("cd /; sleep 30", timeout=1)
        assert timed_out.reason is ExitReason.TIMEOUT
        assert (await shell.exec("pwd")).text.strip().endswith("/deep/er")
    stateless = await sandbox.exec('echo "${COUNT:-unset}"; pwd')
    assert stateless.text.split()[0] == "unset"
    assert not stateless.text.strip().endswith("/deep/er")


async def test_network_is_off_by_default(make_adapter) -> None:
    adapter = make_adapter()
    if adapter.name == "kubernetes":
        pytest.skip(
            "kubernetes: a pod always has an interface; network off is the pod's egress filter (and the "
            "namespace's deny-egress NetworkPolicy), whose traffic test_network.py and test_attacks.py check"
        )
    box = await adapter.create(oa.SandboxSpec(ttl=120))
    try:
        interfaces = await box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert interfaces.text.split() == ["lo"]
    finally:
        await box.close()


async def test_closing_a_sandbox_ends_everything(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=120))
    await box.exec("sleep 300 >/dev/null 2>&1 &")
    assert box.id in await adapter.list_owned()
    await box.close()
    assert box.id not in await adapter.list_owned()
    assert (await box.exec("true")).reason is ExitReason.SANDBOX_LOST


async def test_sigkill_reads_as_killed(sandbox: oa.Sandbox) -> None:
    killed = await sandbox.exec("sh -c 'kill -KILL $$'")
    assert (killed.exit_code, killed.reason) == (137, ExitReason.KILLED)
    crashed = await sandbox.exec("sh -c 'kill -SEGV $$'")
    assert (crashed.exit_code, crashed.reason) == (139, ExitReason.NONZERO)
