"""The network fault state of a chaos run as one value, and the nftables ruleset that enforces it.
Pure: no I/O. The shell (chaos/netns.py) loads the rendered text with `nft -f -`, which replaces
the whole table in one transaction, so every change of faults is atomic and a heal is `none()`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

# Names that go into the nft script unquoted (table) or quoted (ports): a strict alphabet, so a
# host or port name can never inject nft syntax.
_NFT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,30}$")
_MIN_RING_HOSTS = 3


def _no_loss() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NetFaults:
    """blocked: directed (src, dst) host pairs whose IPv4 packets are dropped in the switch.
    loss: host -> percent (1..100) of the packets it sends and of those it receives that are
    dropped. Hashable and immutable; hosts are plain names ("broker-a-n0", "client")."""

    blocked: frozenset[tuple[str, str]] = frozenset()
    loss: Mapping[str, int] = field(default_factory=_no_loss)

    def __post_init__(self) -> None:
        blocked = frozenset(self.blocked)
        for src, dst in blocked:
            if src == dst:
                raise ValueError(f"a host cannot be cut from itself: {src!r}")
        loss: dict[str, int] = {}
        for host, pct in sorted(self.loss.items()):
            if not isinstance(pct, int) or not 0 <= pct <= 100:
                raise ValueError(f"loss for {host!r} must be 0..100 percent, not {pct!r}")
            if pct:  # 0 % is no fault: dropped, so equal states compare equal
                loss[host] = pct
        object.__setattr__(self, "blocked", blocked)
        object.__setattr__(self, "loss", MappingProxyType(loss))

    def __hash__(self) -> int:
        return hash((self.blocked, frozenset(self.loss.items())))

    # ---- constructors ------------------------------------------------------------------------

    @classmethod
    def none(cls) -> NetFaults:
        """Full connectivity: the healed state."""
        return cls()

    @classmethod
    def isolate(cls, host: str, all_hosts: Iterable[str]) -> NetFaults:
        """`host` reaches nobody and nobody reaches it."""
        hosts = _distinct(all_hosts)
        _require_members([host], hosts)
        others = [h for h in hosts if h != host]
        return cls(frozenset({(host, o) for o in others} | {(o, host) for o in others}))

    @classmethod
    def partition(cls, groups: Sequence[Sequence[str]], all_hosts: Iterable[str]) -> NetFaults:
        """Every pair of hosts in different groups is cut, both ways. Hosts listed in no group
        are unaffected: they still reach everyone (put them in a group to cut them too)."""
        hosts = _distinct(all_hosts)
        seen: set[str] = set()
        for g in groups:
            _require_members(g, hosts)
            if seen & set(g):
                raise ValueError(f"hosts {sorted(seen & set(g))} are in more than one group")
            seen |= set(g)
        blocked = {
            (a, b)
            for i, ga in enumerate(groups)
            for j, gb in enumerate(groups)
            if i != j
            for a in ga
            for b in gb
        }
        return cls(frozenset(blocked))

    @classmethod
    def one_way(cls, src: str, dst: str) -> NetFaults:
        """Packets from src to dst are dropped; dst -> src still flows. TCP needs both
        directions, so round trips fail both ways; only datagrams see the asymmetry
        (chaos.md pitfall 5)."""
        return cls(frozenset({(src, dst)}))

    @classmethod
    def ring(cls, hosts: Sequence[str]) -> NetFaults:
        """Nobody sees the same majority. With 4 or more hosts, each reaches only the hosts
        within k places of it on the ring, k the smallest that makes itself plus its
        neighbours a majority: Jepsen's majorities ring for 5 (each sees its two neighbours).
        With 3 hosts that would cut nothing, so the ring is directed instead: i -> i+1 is cut
        (0->1, 1->2, 2->0), every host still hears from one peer and reaches the other."""
        ring = _distinct(hosts)
        n = len(ring)
        if n < _MIN_RING_HOSTS:
            raise ValueError(f"a ring needs at least {_MIN_RING_HOSTS} hosts, not {n}")
        if n == _MIN_RING_HOSTS:
            return cls(frozenset({(ring[i], ring[(i + 1) % n]) for i in range(n)}))
        majority_peers = n // 2  # others a host must reach to see a majority with itself
        k = (majority_peers + 1) // 2
        blocked = set()
        for i in range(n):
            for j in range(n):
                distance = min((i - j) % n, (j - i) % n)
                if distance > k:
                    blocked.add((ring[i], ring[j]))
        return cls(frozenset(blocked))

    @classmethod
    def bridge(cls, side_a: Sequence[str], side_b: Sequence[str], middle: str) -> NetFaults:
        """Two halves that cannot talk to each other, and one host that talks to both (Jepsen's
        bridge: the middle can be elected by both sides)."""
        if middle in side_a or middle in side_b:
            raise ValueError(f"the middle host {middle!r} must be on neither side")
        return cls.partition([side_a, side_b], [*side_a, *side_b, middle])

    # ---- combinators -------------------------------------------------------------------------

    def with_loss(self, host: str, pct: int) -> NetFaults:
        """The same faults, and `pct` % of `host`'s packets lost each way (0 removes it)."""
        loss = dict(self.loss)
        loss[host] = pct
        return NetFaults(self.blocked, loss)

    def union(self, other: NetFaults) -> NetFaults:
        """Both fault states at once: every cut of either, the higher loss per host."""
        loss = dict(self.loss)
        for host, pct in other.loss.items():
            loss[host] = max(pct, loss.get(host, 0))
        return NetFaults(self.blocked | other.blocked, loss)

    def __or__(self, other: NetFaults) -> NetFaults:
        return self.union(other)

    @property
    def empty(self) -> bool:
        return not self.blocked and not self.loss

    def hosts(self) -> frozenset[str]:
        """Every host this state names."""
        return frozenset(h for pair in self.blocked for h in pair) | frozenset(self.loss)


def render_ruleset(table: str, faults: NetFaults, port_of: Mapping[str, str]) -> str:
    """The whole `bridge`-family table for `faults`, as an `nft -f` script that first declares,
    then flushes, then redefines it (so it loads whether or not the table exists, in one
    transaction). port_of maps each host to its bridge port (host-side veth).

    Only the forward hook is used: it sees frames switched between two ports and never the
    traffic between a node and the bridge's own address, so the harness's control path
    survives every fault. The rules are stateless (a bridge table has no conntrack here), so
    flows established before a fault are cut too (chaos.md pitfall 2). Drops happen in the
    switch, not at the sender, so applications see silence, not EPERM (pitfall 4)."""
    if not _NFT_NAME.match(table):
        raise ValueError(f"bad nft table name {table!r}")
    for host in sorted(faults.hosts()):
        port = port_of.get(host)
        if port is None:
            raise KeyError(f"no bridge port for host {host!r}")
        if not _NFT_NAME.match(port):
            raise ValueError(f"bad bridge port name {port!r} for host {host!r}")
    lines = [
        f"table bridge {table}",
        f"flush table bridge {table}",
        f"table bridge {table} {{",
        "\tchain xfwd {",  # not `fwd`: that word is a keyword in nft's grammar (a syntax error)
        "\t\ttype filter hook forward priority -100; policy accept;",
        # ARP (and anything not IPv4) always passes, so neighbours stay resolved and a heal
        # takes effect at once instead of after an ARP retry. IPv6 is off in every namespace.
        "\t\tmeta protocol != ip accept",
    ]
    lines += (
        f'\t\tiifname "{port_of[src]}" oifname "{port_of[dst]}" drop'
        for src, dst in sorted(faults.blocked)
    )
    for host, pct in sorted(faults.loss.items()):
        port = port_of[host]
        # numgen draws 0..99: `< pct` drops pct %; 100 % is written as a plain drop.
        chance = "" if pct >= 100 else f" numgen random mod 100 < {pct}"
        lines.append(f'\t\tiifname "{port}"{chance} drop')
        lines.append(f'\t\toifname "{port}"{chance} drop')
    lines += ["\t}", "}", ""]
    return "\n".join(lines)


def _distinct(hosts: Iterable[str]) -> list[str]:
    out = list(hosts)
    if len(set(out)) != len(out):
        raise ValueError(f"hosts are listed twice: {out}")
    return out


def _require_members(hosts: Iterable[str], all_hosts: Sequence[str]) -> None:
    unknown = [h for h in hosts if h not in all_hosts]
    if unknown:
        raise ValueError(f"unknown hosts {unknown}; the hosts are {list(all_hosts)}")


def blocked_pairs(text: str, host_of_port: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """The (src, dst) host pairs a rendered ruleset drops unconditionally (for tests and
    reports: reads back what render_ruleset wrote)."""
    for m in re.finditer(r'iifname "([^"]+)" oifname "([^"]+)" drop', text):
        yield host_of_port[m.group(1)], host_of_port[m.group(2)]
