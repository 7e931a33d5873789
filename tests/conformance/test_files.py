"""File operations and patches every adapter must share."""

from __future__ import annotations

import pytest

import orchard_async as oa
from orchard_async.capabilities import FileRoot


async def test_write_read_and_list(sandbox: oa.Sandbox) -> None:
    await sandbox.write_file("a/b/c.txt", "hello\n")
    await sandbox.write_file("a/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert await sandbox.read_file("a/b/c.txt") == b"hello\n"
    entries = {entry.name: entry for entry in await sandbox.list_dir("a")}
    assert set(entries) == {"b", "run.sh"}
    assert entries["b"].is_dir and not entries["run.sh"].is_dir
    assert entries["run.sh"].mode == 0o755 and entries["run.sh"].size == len("#!/bin/sh\necho ran\n")
    assert (await sandbox.exec("./a/run.sh")).text == "ran\n"


async def test_empty_and_large_files(sandbox: oa.Sandbox) -> None:
    await sandbox.write_file("empty", b"")
    assert await sandbox.read_file("empty") == b""
    big = bytes(range(256)) * 8192  # 2 MiB, past the default output cap
    await sandbox.write_file("big.bin", big)
    assert await sandbox.read_file("big.bin") == big


async def test_missing_file_and_paths_outside(sandbox: oa.Sandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("does/not/exist")
    with pytest.raises(oa.PathOutsideSandbox):
        await sandbox.read_file("../../../../../../etc/passwd" if sandbox_root_is_private(sandbox) else "x\0y")


def sandbox_root_is_private(sandbox: oa.Sandbox) -> bool:
    return isinstance(sandbox, FileRoot) and sandbox.root != "/"


async def test_apply_patch(sandbox: oa.Sandbox) -> None:
    await sandbox.write_file("pkg/mod.txt", "one\ntwo\nthree\n")
    patch = "--- a/pkg/mod.txt\n+++ b/pkg/mod.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    result = await sandbox.apply_patch(patch)
    assert result.ok, result.error_text
    assert await sandbox.read_file("pkg/mod.txt") == b"one\nTWO\nthree\n"
    failed = await sandbox.apply_patch(patch.replace("-two", "-missing"))
    assert not failed.ok


async def test_the_workdir_is_workspace_and_writable_dirs_exist(make_adapter) -> None:
    """Every adapter with a shell shows its work dir at /workspace (local: a bind of its own
    dir) and makes spec.writable_dirs at start: writable by commands and by the file API, which
    reaches every path a command does (the root's listing included)."""
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300, writable_dirs=("/app", "/logs", "/app/sub")))
    try:
        assert box.workdir == "/workspace"
        assert (await box.exec("pwd")).text == "/workspace\n"
        made = await box.exec("for d in /app /logs /app/sub /workspace; do echo x >$d/by-command || exit 1; done")
        assert made.ok, made.error_text
        for path in ("/app/by-api", "/logs/by-api", "/app/sub/by-api", "/workspace/by-api"):
            await box.write_file(path, path)
        shown = await box.exec("cat /app/by-api /logs/by-api /app/sub/by-api by-api")
        assert shown.text == "/app/by-api/logs/by-api/app/sub/by-api/workspace/by-api", shown
        assert await box.read_file("/logs/by-command") == b"x\n"
        assert {"app", "logs", "workspace", "etc"} <= {entry.name for entry in await box.list_dir("/")}
        assert (await box.read_file("/etc/passwd")).startswith(b"root:")
    finally:
        await box.close()
