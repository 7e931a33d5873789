"""The remote adapter: the library's conformance suite, run through a service.

Every conformance test of commands, files and streams runs here with sandboxes of a ``local``
service reached over HTTP: what the library promises holds through the service too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import orchard_async as oa
from orchard_async.adapters.remote import RemoteAdapter
from tests.conformance import test_stream as conformance_stream
from tests.conformance.test_exec import (  # noqa: F401 - collected here, against the remote adapter
    test_background_process_survives_a_finished_command,
    test_bad_input_is_rejected_before_running,
    test_binary_output_is_byte_exact,
    test_closing_a_sandbox_ends_everything,
    test_cwd_and_env,
    test_exit_codes_and_reasons,
    test_network_is_off_by_default,
    test_output_cap_keeps_head_and_tail,
    test_quoting_survives_any_text,
    test_session_keeps_state_and_exec_does_not,
    test_sigkill_reads_as_killed,
    test_stdin_is_eof_unless_given,
    test_stdout_and_stderr_are_separate,
    test_timeout_kills_the_process_tree,
)
from tests.conformance.test_files import (  # noqa: F401
    test_apply_patch,
    test_empty_and_large_files,
    test_missing_file_and_paths_outside,
    test_write_read_and_list,
)
from tests.conformance.test_stream import (  # noqa: F401 - over the service's PTY socket
    test_a_stream_reports_a_missing_program,
    test_an_http_server_inside_is_reached_by_connect_httpx_and_a_forward,
    test_connect_echoes_both_ways,
    test_connect_to_a_port_nothing_listens_on_is_refused,
)
from tests.service.conftest import Service


@pytest.mark.soak  # 100 MB through the service's PTY socket, ~40 s on 2 cores: the soak run
async def test_a_stream_to_a_process_echoes_100_mb_both_ways_and_its_process_ends_with_it(sandbox: oa.Sandbox) -> None:
    await conformance_stream.test_a_stream_to_a_process_echoes_100_mb_both_ways_and_its_process_ends_with_it(sandbox)


# The adapter options the conformance tests pass (output_cap=): the service's adapter's
# business, so each gets a service of its own, started up front (make_adapter is synchronous).
SERVICE_OPTIONS = ({}, {"output_cap": 1000})


@pytest.fixture
async def make_adapter(start_service: Callable[..., Awaitable[Service]]) -> AsyncIterator[Callable[..., Any]]:
    """Remote adapters to services over the local adapter; each adapter made is closed at the
    end and must have destroyed everything it created."""
    services = {repr(options): await start_service("local", adapter_options=options) for options in SERVICE_OPTIONS}
    made: list[RemoteAdapter] = []

    def make(**options: Any) -> RemoteAdapter:
        adapter = RemoteAdapter(url=services[repr(options)].url)
        made.append(adapter)
        return adapter

    yield make
    for adapter in made:
        await adapter.close()
        assert await adapter.list_owned() == []


@pytest.fixture
async def sandbox(make_adapter: Callable[..., oa.Adapter]) -> AsyncIterator[oa.Sandbox]:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        yield box
    finally:
        await box.close()


async def test_a_stream_into_a_service_without_processes_or_into_a_gone_sandbox_is_refused_in_one_line(
    start_service: Callable[..., Awaitable[Service]],
) -> None:
    """The service's PTY socket says why before any process starts: its adapter runs no
    processes (sim: ConfigError, as the sim adapter's own sandboxes say), or the sandbox is gone."""
    sim = await start_service("sim")
    async with RemoteAdapter(url=sim.url) as adapter:
        box = await adapter.create(oa.SandboxSpec(ttl=60))
        with pytest.raises(oa.ConfigError, match="no byte stream into a sandbox"):
            await box.open_stream(["cat"])
        with pytest.raises(oa.ConfigError, match="no byte stream into a sandbox"):
            await box.connect(8080)
        await box.close()
        with pytest.raises(oa.SandboxLost, match=f"no stream into {box.id}"):
            await box.open_stream(["cat"])
