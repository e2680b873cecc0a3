"""Value types shared by the servers and the SDK: a message queue (QueueRef) and a broker group's
member (Member) with the parser of a members list. Values and parsing only; no I/O."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """One message queue: ordered by (topic, broker group, queue id), as RocketMQ sorts them."""

    topic: str
    broker_group: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_group}#{self.queue_id}"


@dataclass(frozen=True, slots=True)
class Member:
    """One node of the broker group: its id, gRPC address and Raft address."""

    node_id: str
    address: str
    raft_address: str


def check_host_port(value: str, what: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{what} {value!r} is not host:port")


def parse_members(text: str) -> tuple[Member, ...]:
    """`n0=GRPC_HOST:PORT/RAFT_HOST:PORT,n1=...`: the whole group, this node included."""
    members: list[Member] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        node_id, eq, addrs = item.partition("=")
        address, slash, raft_address = addrs.partition("/")
        if not eq or not slash or not node_id.strip():
            raise ValueError(f"member {item!r} must look like n0=GRPC_HOST:PORT/RAFT_HOST:PORT")
        check_host_port(address, f"member {node_id} gRPC address")
        check_host_port(raft_address, f"member {node_id} raft address")
        members.append(Member(node_id.strip(), address.strip(), raft_address.strip()))
    for attr in ("node_id", "address", "raft_address"):
        values = [getattr(m, attr) for m in members]
        if len(set(values)) != len(values):
            raise ValueError(f"members repeat a {attr}: {text!r}")
    return tuple(members)
