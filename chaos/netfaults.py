"""The network fault state of a chaos run as one value, and its nftables ruleset. Pure: the
shell (chaos/netns.py) loads the rendered text with `nft -f -`, which swaps the whole table in
one transaction, so every change of faults is atomic and a heal is the empty state."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NetFaults:
    """blocked: directed (src, dst) host pairs whose IPv4 packets are dropped.
    loss: host -> percent of the packets it sends or receives that are dropped."""

    blocked: frozenset[tuple[str, str]] = frozenset()
    loss: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def none(cls) -> NetFaults:
        return cls()

    @classmethod
    def isolate(cls, host: str, all_hosts: Iterable[str]) -> NetFaults:
        """`host` reaches nobody and nobody reaches it."""
        return cls.partition([[host]], all_hosts, rest_together=True)

    @classmethod
    def partition(
        cls, groups: Sequence[Sequence[str]], all_hosts: Iterable[str], rest_together: bool = False
    ) -> NetFaults:
        """Hosts in different groups cannot talk, both ways. Hosts in no group keep talking to
        everyone, unless rest_together: then they form one more group of their own."""
        groups = [list(g) for g in groups]
        if rest_together:
            listed = {h for g in groups for h in g}
            groups.append([h for h in all_hosts if h not in listed])
        blocked: set[tuple[str, str]] = set()
        for a, b in itertools.permutations(range(len(groups)), 2):
            blocked.update((x, y) for x in groups[a] for y in groups[b])
        return cls(frozenset(blocked))

    @classmethod
    def one_way(cls, src: str, dst: str) -> NetFaults:
        """Packets from src to dst are dropped; dst -> src still flows. TCP needs both
        directions, so connections break both ways; datagrams see the asymmetry."""
        return cls(frozenset({(src, dst)}))

    @classmethod
    def ring(cls, hosts: Sequence[str]) -> NetFaults:
        """Each host reaches only its ring neighbours (Jepsen's majorities ring for 5 hosts)."""
        n = len(hosts)
        neighbours = {(hosts[i], hosts[(i + d) % n]) for i in range(n) for d in (1, n - 1)}
        blocked = {(a, b) for a, b in itertools.permutations(hosts, 2) if (a, b) not in neighbours}
        return cls(frozenset(blocked))

    @classmethod
    def bridge(cls, side_a: Sequence[str], side_b: Sequence[str], middle: str) -> NetFaults:
        """Two halves that cannot talk, and one host that talks to both."""
        return cls.partition([side_a, side_b], [*side_a, *side_b, middle])

    def with_loss(self, host: str, pct: int) -> NetFaults:
        if not 0 <= pct <= 100:
            raise ValueError(f"loss must be 0..100 percent, not {pct}")
        loss = dict(self.loss)
        if pct:
            loss[host] = pct
        else:
            loss.pop(host, None)
        return NetFaults(self.blocked, loss)

    def union(self, other: NetFaults) -> NetFaults:
        loss = dict(self.loss)
        for h, p in other.loss.items():
            loss[h] = max(p, loss.get(h, 0))
        return NetFaults(self.blocked | other.blocked, loss)

    @property
    def empty(self) -> bool:
        return not self.blocked and not any(self.loss.values())


def render_ruleset(table: str, faults: NetFaults, port_of: Mapping[str, str]) -> str:
    """The whole bridge-family table. Forwarding between bridge ports only: traffic to and from
    the bridge's own address (the harness's control path) never crosses this hook. Stateless
    rules (no conntrack in a bridge table), so established flows are cut too."""
    for a, b in faults.blocked:
        for h in (a, b):
            if h not in port_of:
                raise KeyError(f"no bridge port for host {h!r}")
    lines = [
        f"table bridge {table}",
        f"flush table bridge {table}",
        f"table bridge {table} {{",
        "  chain xfwd {",  # not `fwd`: a keyword in nft's grammar
        "    type filter hook forward priority -100; policy accept;",
        "    meta protocol != ip accept",  # ARP passes, so a heal takes effect at once
    ]
    for src, dst in sorted(faults.blocked):
        lines.append(f'    iifname "{port_of[src]}" oifname "{port_of[dst]}" drop')
    for host, pct in sorted(faults.loss.items()):
        if pct <= 0:
            continue
        port = port_of[host]
        # numgen's range is 0..99: 100 % is a plain drop.
        chance = "" if pct >= 100 else f" numgen random mod 100 < {pct}"
        lines.append(f'    iifname "{port}"{chance} drop')
        lines.append(f'    oifname "{port}"{chance} drop')
    lines += ["  }", "}", ""]
    return "\n".join(lines)
