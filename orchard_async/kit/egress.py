"""Switching a sandbox's egress while it runs (``capabilities.NetworkControl``), for adapters.

``NetworkSwitch`` is the bookkeeping every adapter shares: the state, its revision, one change
at a time, and failing closed (a change that fails leaves the sandbox without egress). The
adapter supplies how a policy is enforced.

``NamespaceEgress`` enforces one in a Linux network namespace from the host, as root: what
the local adapter (its sandboxes' own namespaces) and the docker adapter (a container's, on
the daemon's machine) use. The boundary is the namespace's own packet filter (iptables,
rebuilt atomically with ``iptables-restore`` on every change), which the sandbox cannot touch:
its processes have no capabilities (``CAP_NET_ADMIN`` least of all). Its output chain accepts
loopback, replies on connections others opened to the sandbox, and the allowlist; every other
packet is rejected (a TCP reset, else ICMP administratively prohibited), so a refusal is fast.
Packets of a connection opened before a change to a destination no longer allowed are
rejected too: nothing carries over from an online phase. A namespace with only loopback (a
sandbox created offline) gets a veth pair to the host on its first change, after its filter
is in place: the host end is ``host_address`` (a /30 of 10.213.0.0/16), masqueraded for
destinations past the host, which the host forwards only with its IPv4 forwarding on
(``net.ipv4.ip_forward=1``, as Docker sets it; it is not turned on here: without it a sandbox
reaches the host's own addresses only). Forwarding between two sandboxes' links is refused.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from orchard_async.capabilities import (
    EgressRule,
    NetworkConflict,
    NetworkPolicy,
    NetworkState,
    network_policy,
)
from orchard_async.errors import ConfigError

# The policy's enforcement, returning the host's address as the sandbox reaches it (or None).
Enforce = Callable[[NetworkPolicy], Awaitable[str | None]]

LINK_POOL = ipaddress.IPv4Network("10.213.0.0/16")
LINK_PREFIX = "oeg"  # host ends of the veth pairs: oeg + 8 hex (interface names stop at 15)
SANDBOX_LINK = "egress0"
RULE_TAG = "orchard-egress"  # the comment on the host's rules for one link: orchard-egress:<link>
COMMAND_TIMEOUT = 20.0
_CHOOSING = threading.Lock()


class NetworkSwitch:
    """A sandbox's egress state and the one way to change it. ``refusal``: why this sandbox's
    network cannot be switched (``set_network`` raises it as a ``ConfigError``)."""

    def __init__(
        self,
        initial: NetworkPolicy,
        enforce: Enforce | None = None,
        *,
        refusal: str = "",
        host_address: str | None = None,
    ):
        self._enforce = enforce
        self.refusal = refusal if refusal or enforce else "this sandbox's network cannot be switched"
        self.state = NetworkState(mode=initial.mode, allow=initial.allow, host_address=host_address)
        self._lock = anyio.Lock()

    async def set(
        self, mode: str, allow: Sequence[EgressRule | Mapping[str, Any]] = (), *, revision: int | None = None
    ) -> NetworkState:
        policy = network_policy(mode, allow)
        if self.refusal or self._enforce is None:
            raise ConfigError(self.refusal)
        if revision is not None and self._lock.locked():
            raise NetworkConflict(f"another network change is under way (revision {self.state.revision})")
        async with self._lock:
            current = self.state
            if revision is not None and revision != current.revision:
                raise NetworkConflict(f"the network is at revision {current.revision}, not {revision}")
            with anyio.CancelScope(shield=True):  # a change cut halfway would leave no known state
                try:
                    host = await self._enforce(policy)
                except BaseException:
                    await self._fail_closed(current)
                    raise
            self.state = NetworkState(
                mode=policy.mode,
                allow=policy.allow,
                revision=current.revision + 1,
                host_address=host or current.host_address,
            )
            return self.state

    async def _fail_closed(self, current: NetworkState) -> None:
        """After a failed change: no egress at all, and the state says so (if even that fails,
        the state stays unknown to nobody: the caller sees the first error)."""
        assert self._enforce is not None
        try:
            await self._enforce(NetworkPolicy(mode="restricted"))
        except Exception:
            return
        self.state = NetworkState(mode="restricted", revision=current.revision + 1, host_address=current.host_address)


# -- a network namespace, from the host ------------------------------------------------------


def forwarding_note() -> str:
    """For doctor: what a switched sandbox reaches beyond the host here."""
    try:
        with open("/proc/sys/net/ipv4/ip_forward") as forward:
            on = forward.read().strip() == "1"
    except OSError:
        on = False
    return "" if on else " (IPv4 forwarding is off here: only the host's own addresses are reachable)"


@functools.cache  # asked at every create; neither the user nor the tools change during a run
def namespace_refusal() -> str:
    """Why this process cannot switch a namespace's egress here ("" when it can)."""
    if os.geteuid() != 0:
        return "switching a sandbox's network needs root on the sandbox's machine (veth pairs and iptables)"
    missing = [
        tool
        for tool in ("ip", "iptables-restore", "ip6tables-restore", "iptables", "nsenter")
        if not shutil.which(tool)
    ]
    if missing:
        return f"switching a sandbox's network needs {', '.join(missing)} on this machine"
    return ""


def filter_table(policy: NetworkPolicy, version: int) -> str:
    """The namespace's filter table for ``policy``, as ``iptables-restore`` input (IPv4 or 6)."""
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]"]
    if policy.mode == "enabled":
        return "\n".join([*lines, ":OUTPUT ACCEPT [0:0]", "COMMIT", ""])
    lines += [
        ":OUTPUT DROP [0:0]",
        "-A OUTPUT -o lo -j ACCEPT",
        # Replies on connections opened to the sandbox, never its own earlier connections.
        "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT",
    ]
    for rule in policy.allow:
        if ipaddress.ip_network(rule.cidr).version != version:
            continue
        protocol = rule.protocol.lower()
        ports = f"{rule.port_start}:{rule.port_end}"
        lines.append(f"-A OUTPUT -d {rule.cidr} -p {protocol} -m {protocol} --dport {ports} -j ACCEPT")
    prohibited = "icmp-admin-prohibited" if version == 4 else "icmp6-adm-prohibited"
    lines += [
        "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
        f"-A OUTPUT -j REJECT --reject-with {prohibited}",
        "COMMIT",
        "",
    ]
    return "\n".join(lines)


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if check and done.returncode != 0:
        raise ConfigError(f"{' '.join(argv[:4])} failed: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def _host_rules(link: str, subnet: str) -> list[tuple[str, list[str]]]:
    """The host's rules for one link: (table, rule without -A/-D)."""
    tag = ["-m", "comment", "--comment", f"{RULE_TAG}:{link}"]
    return [
        ("nat", ["POSTROUTING", "-s", subnet, "!", "-d", subnet, "-j", "MASQUERADE", *tag]),
        ("filter", ["FORWARD", "-i", link, "-o", f"{LINK_PREFIX}+", "-j", "REJECT", *tag]),
        ("filter", ["FORWARD", "-i", link, "-j", "ACCEPT", *tag]),
        (
            "filter",
            ["FORWARD", "-o", link, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT", *tag],
        ),
    ]


def remove_host_rules(link: str | None = None) -> None:
    """Delete the host's rules of ``link`` (None: of every link that no longer exists)."""
    # The rules are read before the links: a link's rules are added after the link, so every
    # rule read belongs to a link that existed by then (another sandbox's, being set up now).
    rules = {table: _run(["iptables", "-t", table, "-S"], check=False).splitlines() for table in ("nat", "filter")}
    present = {
        line.split(":")[1].strip().split("@")[0] for line in _run(["ip", "-o", "link"], check=False).splitlines()
    }
    for table, lines in rules.items():
        for line in lines:
            if f"{RULE_TAG}:" not in line or not line.startswith("-A "):
                continue
            owner = line.split(f"{RULE_TAG}:", 1)[1].split()[0].strip('"')
            if owner == link or (link is None and owner not in present):
                _run(["sh", "-c", f"iptables -t {table} -D {line[3:]}"], check=False)


class NamespaceEgress:
    """The egress of the network namespace that a process is in (``pid_of()`` finds its host
    pid when a change is made), enforced from the host. ``close`` removes what it added there."""

    def __init__(self, pid_of: Callable[[], Awaitable[int]], name: str):
        self._pid_of = pid_of
        self.link = f"{LINK_PREFIX}{name[-8:]}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.host_address: str | None = None

    async def enforce(self, policy: NetworkPolicy) -> str | None:
        pid = await self._pid_of()
        return await anyio.to_thread.run_sync(self._enforce, policy, pid)

    def _enforce(self, policy: NetworkPolicy, pid: int) -> str | None:
        if not pid:
            raise ConfigError("the sandbox's process is not known: its network cannot be switched")
        namespace = ["nsenter", f"--net=/proc/{pid}/ns/net"]
        # The filter first: a link added afterwards is never open beyond the policy.
        _run([*namespace, "iptables-restore"], filter_table(policy, 4))
        _run([*namespace, "ip6tables-restore"], filter_table(policy, 6))
        if self.host_address is None:  # a link even when restricted to nothing: host_address is then known
            routes = _run([*namespace, "ip", "-4", "route", "show", "default"], check=False).split()
            if "via" in routes:  # the namespace has a network of its own (docker's bridge): use it
                self.host_address = routes[routes.index("via") + 1]
            else:
                self._add_link(pid, namespace)
        return self.host_address

    def _add_link(self, pid: int, namespace: list[str]) -> None:
        remove_host_rules(None)  # those of links gone with their sandboxes
        with _CHOOSING:  # two sandboxes of this process never pick the same free /30
            self._add_link_locked(pid, namespace)

    def _add_link_locked(self, pid: int, namespace: list[str]) -> None:
        taken = _run(["ip", "-4", "-o", "addr", "show"], check=False)
        subnets = list(LINK_POOL.subnets(new_prefix=30))
        for _ in range(20):
            subnet = random.choice(subnets)
            if f" {subnet[1]}/" not in taken and f" {subnet[2]}/" not in taken:
                break
        else:
            raise ConfigError(f"no free /30 found in {LINK_POOL} for the sandbox's link to the host")
        host, inner = f"{subnet[1]}", f"{subnet[2]}"
        peer = f"{self.link}p"
        _run(["ip", "link", "del", self.link], check=False)
        _run(["ip", "link", "add", self.link, "type", "veth", "peer", "name", peer])
        try:
            _run(["ip", "link", "set", peer, "netns", str(pid)])
            _run(["ip", "addr", "add", f"{host}/30", "dev", self.link])
            _run(["ip", "link", "set", self.link, "up"])
            _run([*namespace, "ip", "link", "set", peer, "name", SANDBOX_LINK])
            _run([*namespace, "ip", "addr", "add", f"{inner}/30", "dev", SANDBOX_LINK])
            _run([*namespace, "ip", "link", "set", SANDBOX_LINK, "up"])
            _run([*namespace, "ip", "link", "set", "lo", "up"])
            _run([*namespace, "ip", "route", "add", "default", "via", host])
            for table, rule in reversed(_host_rules(self.link, str(subnet))):  # each goes first
                _run(["iptables", "-t", table, "-I", *rule[:1], "1", *rule[1:]])
        except BaseException:
            self._remove()
            raise
        self.subnet, self.host_address = subnet, host

    def _remove(self) -> None:
        _run(["ip", "link", "del", self.link], check=False)
        remove_host_rules(self.link)

    async def close(self) -> None:
        """Remove the host end and the host's rules (the namespace's end goes with it)."""
        if self.subnet is not None or self.host_address is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._remove)
