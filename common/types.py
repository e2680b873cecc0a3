"""Value types shared by the servers and the SDK: a message queue (QueueRef), a broker group's
member (Member) with the parser of a members list, and the one parser of address lists
(`a:1,b:2` or RocketMQ's `a:1;b:2`). Values and parsing only; no I/O."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from raftmq.common.errors import InvalidArgumentError

ADDRESS_SEPARATORS = re.compile(r"[,;]")
NAMESRV_PORT = 9876  # RocketMQ's NameServer port, named in the advice for a missing port
MAX_QUEUE_ID = (1 << 31) - 1  # queue ids travel as int32
MAX_OFFSET = (1 << 63) - 1  # queue offsets travel as int64


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """One message queue: ordered by (topic, broker group, queue id), as RocketMQ sorts them."""

    topic: str
    broker_group: str
    queue_id: int

    def __post_init__(self) -> None:
        # A queue id is 0..2**31-1 on the wire and in the store; -1 ("the broker picks") exists
        # only in a send request, never as a queue.
        if not isinstance(self.queue_id, int) or isinstance(self.queue_id, bool):
            raise InvalidArgumentError(
                f"queue_id must be an int, not {type(self.queue_id).__name__}",
                details={"argument": "queue_id"},
            )
        if not 0 <= self.queue_id <= MAX_QUEUE_ID:
            raise InvalidArgumentError(
                f"queue_id {self.queue_id} of {self.topic}@{self.broker_group} is outside "
                f"0..{MAX_QUEUE_ID}; take queues from the topic's route "
                "(consumer.queues_of(topic))",
                details={"argument": "queue_id", "queue_id": str(self.queue_id)},
            )

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_group}#{self.queue_id}"


def check_offset(offset: object, what: str = "offset") -> int:
    """A queue offset (0..2**63-1) as an int; InvalidArgumentError naming `what` otherwise."""
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise InvalidArgumentError(
            f"{what} must be an int, not {type(offset).__name__}", details={"argument": what}
        )
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidArgumentError(
            f"{what} {offset} is outside 0..{MAX_OFFSET}; a queue offset counts messages from 0 "
            "(seek_to_beginning / seek_to_end / seek_to_timestamp find a valid one)",
            details={"argument": what, "offset": str(offset)},
        )
    return offset


@dataclass(frozen=True, slots=True)
class Member:
    """One node of the broker group: its id, gRPC address and Raft address."""

    node_id: str
    address: str
    raft_address: str


def parse_address(value: str, what: str) -> str:
    """One `host:port` (IPv6 as `[::1]:port`), stripped; InvalidArgumentError naming `what`."""
    item = value.strip()
    host, sep, port = item.rpartition(":")
    example = f"e.g. 127.0.0.1:{NAMESRV_PORT}"
    details = {"argument": what, "address": item}
    if ":" in host and not host.startswith("["):
        raise InvalidArgumentError(
            f"{what}: {item!r} is ambiguous; write an IPv6 address in brackets, e.g. [::1]:9876",
            details=details,
        )
    if not sep or not host:
        usual = ""
        if "namesrv" in what.lower() or "nameserver" in what.lower():
            usual = f"; RocketMQ's NameServer port is {NAMESRV_PORT}, so probably {item}:9876"
        raise InvalidArgumentError(
            f"{what}: {item!r} is not host:port (no port given; {example}){usual}",
            details=details,
        )
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgumentError(
            f"{what}: port {port!r} of {item!r} is not a number within 1..65535 ({example})",
            details=details,
        )
    if any(c.isspace() for c in host) or host.startswith(":"):
        raise InvalidArgumentError(
            f"{what}: host {host!r} of {item!r} is not a host name or IP address ({example})",
            details=details,
        )
    return item


def parse_address_list(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    """Every `host:port` of a list given as one string (`,` or `;` between addresses, as
    RocketMQ's `a;b`) or as a sequence of such strings. Refuses an empty list, a missing port and
    a port outside 1..65535 with an InvalidArgumentError naming `what`."""
    if isinstance(value, str):
        raw: list[str] = [value]
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        raw = list(value)
    else:
        raise InvalidArgumentError(
            f"{what} must be a string of host:port addresses (separated by ',' or ';') or a list "
            f"of them, not {type(value).__name__}",
            details={"argument": what},
        )
    items = [p.strip() for text in raw for p in ADDRESS_SEPARATORS.split(text) if p.strip()]
    if not items:
        raise InvalidArgumentError(
            f"{what} is empty; give at least one host:port, e.g. 127.0.0.1:{NAMESRV_PORT} (several "
            "separated by ',' or ';')",
            details={"argument": what},
        )
    out: list[str] = []
    for item in items:
        address = parse_address(item, what)
        if address not in out:
            out.append(address)
    return tuple(out)


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
