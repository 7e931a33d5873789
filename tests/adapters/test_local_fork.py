"""The local adapter's fork methods each on their own (the conformance suite runs the one
this machine picks): a copy (where neither reflink nor overlay works, e.g. as a regular
user) and overlayfs give forks that start as the snapshot, stay apart, are writable by
the sandbox's user like a fresh work dir, and leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async.adapters import local_snapshot as snaps
from orchard_async.adapters.local import LocalAdapter
from tests.conformance.test_fork import LISTING, SETUP


@pytest.mark.parametrize("method", ["copy", "overlay"])
async def test_each_fork_method(tmp_path: Path, method: str) -> None:
    root = tmp_path / "root"
    adapter = LocalAdapter(root=root)
    if method == "overlay" and adapter.fork_method[0] != "overlay":
        pytest.skip(f"overlayfs is not usable here: {adapter.fork_method[1]}")
    adapter.__dict__["fork_method"] = (method, "chosen by the test")
    async with adapter:
        base = await adapter.create(oa.SandboxSpec(ttl=120))
        assert (await base.exec(SETUP)).ok
        expected = (await base.exec(LISTING)).stdout
        snapshot = await adapter.snapshot(base)
        await base.close()
        forks = [await adapter.create(oa.SandboxSpec(ttl=120, snapshot=snapshot)) for _ in range(3)]
        async with await adapter.create(oa.SandboxSpec(ttl=120)) as fresh:  # a fork's work dir is like a fresh one's
            owner = (await fresh.exec("stat -c '%u %g %a' .")).stdout
        assert all([(await box.exec("stat -c '%u %g %a' .")).stdout == owner for box in forks])
        assert all((root / box.id / "upper").is_dir() == (method == "overlay") for box in forks)
        for index, box in enumerate(forks):
            assert (await box.exec(LISTING)).stdout == expected
            assert (await box.exec(f"echo {index} > repo/src/a.txt && touch top-{index} && rm run.sh")).ok
        for index, box in enumerate(forks):
            assert (await box.exec("cat repo/src/a.txt; ls")).stdout == f"{index}\nrepo\ntop-{index}\n".encode()
        for box in forks:
            await box.close()
        await adapter.drop_snapshot(snapshot)
    assert leftovers(root) == ([], [])


def leftovers(root: Path) -> tuple[list[str], list[str]]:
    """Entries under the root, and mounts under it."""
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if str(root) in line]
    return sorted(p.name for p in root.iterdir()), mounts


def test_an_unknown_snapshot_is_the_callers_mistake(tmp_path: Path) -> None:
    with pytest.raises(oa.ConfigError, match="not a local snapshot id"):
        snaps.tree_of(tmp_path, "../etc")
    with pytest.raises(oa.ConfigError, match="does not exist"):
        snaps.tree_of(tmp_path, "snap-0123")
