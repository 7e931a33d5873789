"""The shell protocol's relay mode: command output goes into FIFOs that a process in the
sandbox copies to the client over streams (what a container adapter can open: one exec per
FIFO), ended per command by a marker. Played here with local processes: a server ``sh -s``
and two ``cat <>FIFO`` relays."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from anyio.streams.stapled import StapledByteStream

import orchard_async as oa
from orchard_async.kit.shell import ShellClient, cut_marker, make_output_pipes


def disk_usage(path: Path) -> int:
    return sum(entry.stat().st_blocks * 512 for entry in path.rglob("*") if entry.is_file())


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[ShellClient]:
    ctl, out, work = tmp_path / "ctl", tmp_path / "out", tmp_path / "work"
    for path in (ctl, out, work):
        path.mkdir()
    make_output_pipes(str(out))
    relays = [await anyio.open_process(["sh", "-c", 'exec cat <>"$1"', "relay", str(out / name)]) for name in "oe"]
    server = await anyio.open_process(["sh", "-s"], start_new_session=True)
    assert server.stdin is not None and server.stdout is not None

    async def interrupt(_: ShellClient) -> None:
        os.kill(server.pid, signal.SIGUSR1)

    streams = tuple(relay.stdout for relay in relays)
    shell = ShellClient(
        StapledByteStream(server.stdin, server.stdout),
        workdir=str(work),
        interrupt=interrupt,
        output_cap=1000,
        output_pipes=str(out),
        output_relays=streams,  # type: ignore[arg-type]
    )
    await shell.start(str(ctl))
    try:
        yield shell
    finally:
        await shell.close()
        for process in (server, *relays):
            process.kill()
            await process.aclose()  # closes its pipes too, inside the event loop


async def test_output_and_exit_codes_arrive_through_the_relays(client: ShellClient) -> None:
    result = await client.run("printf 'out\\0\\377'; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\x00\xff", b"err\n", 3)
    assert (await client.run("true")).stdout == b""


async def test_output_over_the_cap_keeps_head_and_tail_and_counts_the_rest(client: ShellClient) -> None:
    result = await client.run("i=0; while [ $i -lt 300 ]; do printf '%09d\\n' $i; i=$((i+1)); done")
    assert result.stdout_cut == 3000 - 1000
    assert result.stdout.startswith(b"000000000\n") and result.stdout.endswith(b"000000299\n")
    assert cut_marker(2000) in result.stdout


async def test_a_marker_split_across_reads_is_found(client: ShellClient) -> None:
    for size in (1, 4095, 4096, 65535, 65536, 65537):
        result = await client.run(f"head -c {size} /dev/zero | tr '\\0' x")
        kept = len(result.stdout) - (len(cut_marker(result.stdout_cut)) if result.stdout_cut else 0)
        assert result.stdout_cut + kept == size and set(result.stdout[:10]) <= {ord("x")}


async def test_huge_output_is_never_spooled(client: ShellClient, tmp_path: Path) -> None:
    result = await client.run("head -c 300000000 /dev/zero; du -sk .. >&2; echo end", timeout=120)
    assert result.ok and result.stdout.endswith(b"end\n")
    assert result.stdout_cut == 300_000_004 - 1000
    assert int(result.stderr.split()[0]) < 1024, "the sandbox's dirs held the output"
    assert disk_usage(tmp_path) < 2**20


async def test_background_output_does_not_block_or_leak_into_later_commands(client: ShellClient) -> None:
    await client.run("(sleep 0.3; echo late) &")
    await anyio.sleep(0.6)
    later = await client.run("echo now")
    assert later.stdout in (b"late\nnow\n", b"now\n")  # written before this command's marker, or dropped
    assert (await client.run("echo again")).stdout == b"again\n"


async def test_timeout_still_interrupts(client: ShellClient) -> None:
    result = await client.run("echo before; sleep 30", timeout=1)
    assert result.reason is oa.ExitReason.TIMEOUT and result.stdout == b"before\n"
    assert (await client.run("echo usable")).stdout == b"usable\n"
