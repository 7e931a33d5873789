"""Network per phase without a backend: the rule and policy checks (Orchard's shapes), the
switch's revision, one-change-at-a-time and failing closed, and the engine switching a sim
sandbox before setup, the agent and scoring (the traffic itself: tests/conformance/test_network.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters.sim import SimAdapter
from orchard_async.capabilities import NetworkPolicy, egress_rule, network_policy
from orchard_async.engine.phases import enter_phase
from orchard_async.kit.egress import NetworkSwitch, filter_table
from orchard_async.records.trajectory import Op
from orchard_async.task import phase_network


def test_a_rule_is_normalized_as_orchard_does() -> None:
    rule = egress_rule({"cidr": "203.0.113.10", "protocol": "tcp", "port_start": 30000})
    assert (rule.cidr, rule.protocol, rule.port_start, rule.port_end) == ("203.0.113.10/32", "TCP", 30000, 30000)
    assert egress_rule({"cidr": "10.1.2.3/8", "protocol": "UDP", "port_start": 53, "port_end": 60}).cidr == "10.0.0.0/8"
    assert egress_rule({"cidr": "2001:db8::1", "port_start": 443}).cidr == "2001:db8::1/128"


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"cidr": "0.0.0.0/0", "port_start": 80}, "every address"),
        ({"cidr": "::/0", "port_start": 80}, "every address"),
        ({"cidr": "pypi.org", "port_start": 443}, "IPv4 or IPv6"),
        ({"port_start": 443}, "cidr is required"),
        ({"cidr": "10.0.0.1"}, "port_start"),
        ({"cidr": "10.0.0.1", "port_start": 0}, "port_start"),
        ({"cidr": "10.0.0.1", "port_start": True}, "port_start"),
        ({"cidr": "10.0.0.1", "port_start": 90, "port_end": 80}, "below"),
        ({"cidr": "10.0.0.1", "port_start": 80, "protocol": "ICMP"}, "TCP or UDP"),
        ({"cidr": "10.0.0.1", "port_start": 80, "host": "x"}, "unknown field"),
    ],
)
def test_a_bad_rule_is_one_line(rule: dict, says: str) -> None:
    with pytest.raises(oa.ConfigError, match=says) as refused:
        egress_rule(rule)
    assert "\n" not in str(refused.value)


def test_modes() -> None:
    assert network_policy("enabled") == oa.ONLINE and network_policy("restricted") == oa.OFFLINE
    with pytest.raises(oa.ConfigError, match="only applies to mode 'restricted'"):
        network_policy("enabled", [{"cidr": "10.0.0.1", "port_start": 80}])
    with pytest.raises(oa.ConfigError, match="must be one of"):
        network_policy("on")
    with pytest.raises(oa.ConfigError, match="a list"):
        network_policy("restricted", {"cidr": "10.0.0.1", "port_start": 80})  # type: ignore[arg-type]
    twice = [{"cidr": "10.0.0.1", "port_start": 80}, {"cidr": "10.0.0.1/32", "port_start": 80, "port_end": 80}]
    assert len(network_policy("restricted", twice).allow) == 1


def test_the_filter_table_allows_only_the_allowlist() -> None:
    policy = network_policy(
        "restricted",
        [
            {"cidr": "10.0.0.1", "port_start": 80, "port_end": 90},
            {"cidr": "2001:db8::/64", "protocol": "udp", "port_start": 53},
        ],
    )
    v4, v6 = filter_table(policy, 4), filter_table(policy, 6)
    assert ":OUTPUT DROP" in v4 and "-A OUTPUT -d 10.0.0.1/32 -p tcp -m tcp --dport 80:90 -j ACCEPT" in v4
    assert "2001:db8" not in v4 and "-A OUTPUT -d 2001:db8::/64 -p udp -m udp --dport 53:53 -j ACCEPT" in v6
    assert "--ctdir REPLY" in v4  # replies only: a connection the sandbox opened earlier is not kept
    assert v4.rstrip().endswith("COMMIT") and "REJECT --reject-with icmp6-adm-prohibited" in v6
    assert ":OUTPUT ACCEPT" in filter_table(oa.ONLINE, 4)


async def test_the_switch_counts_revisions_refuses_stale_ones_and_fails_closed() -> None:
    applied: list[NetworkPolicy] = []
    broken = False
    release = anyio.Event()

    async def enforce(policy: NetworkPolicy) -> str:
        if policy.mode == "enabled" and broken:
            raise OSError("iptables-restore failed")
        applied.append(policy)
        if policy.allow and policy.allow[0].port_start == 9:
            await release.wait()
        return "10.9.9.1"

    switch = NetworkSwitch(oa.OFFLINE, enforce)
    assert (await switch.set("enabled")).revision == 1
    with pytest.raises(oa.NetworkConflict, match="revision 1, not 0"):
        await switch.set("restricted", revision=0)
    state = await switch.set("restricted", [{"cidr": "10.0.0.1", "port_start": 80}], revision=1)
    assert (state.revision, state.host_address, state.allow[0].cidr) == (2, "10.9.9.1", "10.0.0.1/32")

    async with anyio.create_task_group() as group:
        group.start_soon(switch.set, "restricted", [{"cidr": "10.0.0.1", "port_start": 9}])
        await anyio.sleep(0.01)
        with pytest.raises(oa.NetworkConflict, match="under way"):  # a conditional change never waits
            await switch.set("enabled", revision=3)
        release.set()
    assert switch.state.revision == 3

    broken = True
    with pytest.raises(OSError):
        await switch.set("enabled")
    assert (switch.state.mode, switch.state.allow, switch.state.revision) == ("restricted", (), 4)
    assert applied[-1] == oa.OFFLINE

    refused = NetworkSwitch(oa.OFFLINE, refusal="not here")
    with pytest.raises(oa.ConfigError, match="not here"):
        await refused.set("enabled")
    with pytest.raises(oa.ConfigError, match="every address"):  # the request is checked first
        await refused.set("restricted", [{"cidr": "0.0.0.0/0", "port_start": 1}])


# -- the engine ------------------------------------------------------------------------------


@dataclass
class PhasedTask:
    id: str
    network: oa.PhaseNetworks | None
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 3
    deadline: float = 60.0
    score_timeout: float = 5.0
    exec_timeout: float = 5.0
    seen: dict[str, str] = field(default_factory=dict)

    async def setup(self, sandbox: oa.Sandbox) -> str:
        self.seen["setup"] = (await sandbox.inner.get_network()).mode  # type: ignore[attr-defined]
        return "go"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        self.seen["scoring"] = (await sandbox.inner.get_network()).mode  # type: ignore[attr-defined]
        return oa.Reward(value=1.0, success=True)


@dataclass
class PhasedApart(PhasedTask):
    async def submission(self, sandbox: oa.Sandbox) -> str:
        return "answer"

    async def grade(self, submission: str, sandbox: oa.Sandbox) -> oa.Reward:
        return await self.evaluate(sandbox)


class LookThenSubmit:
    name = "look"

    async def act(self, observation: oa.Observation) -> oa.Action:
        return oa.Action(command="true") if observation.step == 0 else oa.Action(kind="submit")


async def run_one(task: PhasedTask) -> oa.Trajectory:
    pool = oa.Pool(SimAdapter())
    async with contextlib.aclosing(oa.rollout([task], LookThenSubmit(), pool)) as stream:
        [trajectory] = [t async for t in stream]
    return trajectory


@pytest.mark.parametrize("kind", [PhasedTask, PhasedApart])
async def test_the_engine_switches_before_each_phase(kind: type[PhasedTask]) -> None:
    task = kind("t", oa.PhaseNetworks(setup=oa.ONLINE, agent=oa.OFFLINE, scoring=oa.ONLINE))
    trajectory = await run_one(task)
    assert trajectory.status == "finished", trajectory.error
    assert task.seen == {"setup": "enabled", "scoring": "enabled"}
    switches = [op.outcome for op in trajectory.ops if op.name == "network"]
    assert switches == ["setup enabled", "agent restricted", "scoring enabled"]


async def test_an_undeclared_phase_has_the_specs_network_and_no_declaration_changes_nothing() -> None:
    task = PhasedTask("t", oa.PhaseNetworks(setup=oa.ONLINE))
    trajectory = await run_one(task)
    assert [op.outcome for op in trajectory.ops if op.name == "network"] == ["setup enabled", "agent restricted"]
    assert task.seen == {"setup": "enabled", "scoring": "restricted"}
    plain = await run_one(PhasedTask("t", None))
    assert plain.status == "finished" and not [op for op in plain.ops if op.name == "network"]


async def test_a_sandbox_that_cannot_switch_is_a_one_line_error() -> None:
    task = PhasedTask("t", oa.PhaseNetworks(setup=oa.ONLINE))
    with pytest.raises(oa.ConfigError, match="cannot switch theirs"):
        await enter_phase(task, "setup", object(), [], 0.0)  # type: ignore[arg-type]
    ops: list[Op] = []
    await enter_phase(PhasedTask("t", None), "setup", object(), ops, 0.0)  # type: ignore[arg-type]
    assert ops == []
    with pytest.raises(oa.ConfigError, match="must be a PhaseNetworks"):
        phase_network(PhasedTask("t", {"setup": "on"}), "setup")  # type: ignore[arg-type]


def test_switching_a_namespace_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchard_async.kit import egress

    monkeypatch.setattr(egress.os, "geteuid", lambda: 1000)
    egress.namespace_refusal.cache_clear()
    try:
        assert "needs root" in egress.namespace_refusal()
        monkeypatch.setattr(egress.os, "geteuid", lambda: 0)
        monkeypatch.setattr(egress.shutil, "which", lambda tool: None if tool == "iptables-restore" else "/bin/" + tool)
        egress.namespace_refusal.cache_clear()
        assert egress.namespace_refusal() == "switching a sandbox's network needs iptables-restore on this machine"
    finally:
        egress.namespace_refusal.cache_clear()


@pytest.mark.parametrize("kind", [PhasedTask, PhasedApart])
async def test_a_refused_switch_before_scoring_is_the_tasks_error_not_retried(
    kind: type[PhasedTask], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard_async.adapters.sim import SimSandbox

    async def refuse(self: SimSandbox, mode: str, allow: object = (), *, revision: int | None = None) -> None:
        raise oa.ConfigError("cannot switch here")

    monkeypatch.setattr(SimSandbox, "set_network", refuse)
    trajectory = await run_one(kind("t", oa.PhaseNetworks(scoring=oa.ONLINE)))
    assert (trajectory.end_reason, trajectory.retries) == (oa.EndReason.TASK_ERROR, [])
    assert "cannot switch here" in trajectory.error
