"""Leader balancing, pure: which group leaderships the controller should hand to each group's
preferred node (DLedger's preferredLeaderId). Without a configured preference, group i of the
sorted group names prefers its i-th node (mod the group size), so the leaders of several groups
sit on different node ids and so, in a deployment that puts node id k of every group on machine
k, on different machines. Only nodes that report (controller/liveness.py) take part: the target
must have reported without a gap for hold_ms, so a flapping node is not handed leadership. No clock
is read and nothing is sent here; the shell checks that the target follows the current leader,
then asks that leader for a Raft leadership transfer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raftmq.controller.liveness import Seen
from raftmq.controller.state import GroupRecord


@dataclass(frozen=True, slots=True)
class BalancePolicy:
    enabled: bool = True
    interval_ms: int = 10_000  # at most one transfer attempt per group in this time
    hold_ms: int = 5_000  # leave a group alone this long after its leader changed
    alive_ms: int = 65_000  # a node that has not reported for this long is not asked or picked

    def __post_init__(self) -> None:
        assert self.interval_ms > 0 and self.hold_ms >= 0 and self.alive_ms > 0, self


@dataclass(frozen=True, slots=True)
class Transfer:
    broker_group: str
    from_node: str
    from_address: str
    to_node: str
    to_address: str


def parse_preferred(text: str) -> dict[str, str]:
    """ "broker-a=n1,broker-b=n2" -> {"broker-a": "n1", "broker-b": "n2"}."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        group, sep, node = part.partition("=")
        if not sep or not group.strip() or not node.strip():
            raise ValueError(f"preferred leader {part!r} must look like group=node_id")
        out[group.strip()] = node.strip()
    return out


def preferred_node(
    group: str, members: Sequence[str], all_groups: Sequence[str], configured: Mapping[str, str]
) -> str:
    """The node that should lead `group`: the configured one, else by the group's position."""
    if group in configured:
        return configured[group]
    if not members:
        return ""
    ordered = sorted(members)
    position = sorted(all_groups).index(group) if group in all_groups else 0
    return ordered[position % len(ordered)]


def plan(
    records: Sequence[GroupRecord],
    configured: Mapping[str, str],
    last_attempt_ms: Mapping[str, int],
    seen: Mapping[tuple[str, str], Seen],
    now_ms: int,
    policy: BalancePolicy,
) -> list[Transfer]:
    """The transfers to attempt now: groups led by another node than their preferred one, whose
    leadership has been stable for hold_ms, which had no attempt within interval_ms, whose leader
    reports and whose preferred node has reported without a gap for hold_ms."""
    if not policy.enabled:
        return []
    names = [r.broker_group for r in records]
    out = []
    for r in records:
        if not r.leader_node_id:
            continue  # no leader recorded: nothing to hand over
        want = preferred_node(r.broker_group, list(r.members), names, configured)
        if not want or want == r.leader_node_id or want not in r.members:
            continue
        if now_ms - r.changed_ms < policy.hold_ms:
            continue  # a node that just lost or won leadership may be flapping
        if now_ms - last_attempt_ms.get(r.broker_group, -(1 << 62)) < policy.interval_ms:
            continue
        target = seen.get((r.broker_group, want))
        if target is None or not target.alive(now_ms, policy.alive_ms):
            continue  # dead or silent: never hand it leadership
        if target.up_for_ms(now_ms) < policy.hold_ms:
            continue  # just came back: it may be flapping
        source = seen.get((r.broker_group, r.leader_node_id))
        if source is None or not source.alive(now_ms, policy.alive_ms):
            continue  # the leader does not report: it could not be asked anyway
        out.append(
            Transfer(r.broker_group, r.leader_node_id, r.leader_address, want, r.members[want])
        )
    return out
