"""Where a consumer starts and where its committed offsets live: the broker group (clustering,
replicated state) or a local file (broadcasting). Shared by PullConsumer and PushConsumer.
A consumer's broker calls go over the framed data path only; Admin's over gRPC."""

from __future__ import annotations

import enum
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import grpc
from google.protobuf.message import Message

from raftmq.client.data_pool import DataPool, no_data_address
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import RaftMQError, from_rpc_error
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef

RPC_TIMEOUT_S = 10.0


class StartFrom(enum.Enum):
    """Where a queue with no committed offset starts (RocketMQ's ConsumeFromWhere)."""

    EARLIEST = "earliest"
    LATEST = "latest"


class BrokerOffsets:
    """Offsets and bounds of queues, asked of each group's leader."""

    def __init__(
        self, group: str, routes: RouteCache, pool: ChannelPool, data: DataPool | None = None
    ) -> None:
        self.group = group
        self._routes = routes
        self._pool = pool
        self._data = data  # None: gRPC (the admin plane); else frames only

    def _call(self, q: QueueRef, method: DataMethod, fn_name: str, req: Message) -> object:
        """`req` to the group's leader, up to 3 tries on retryable errors; each call is
        idempotent (reads, and commits of absolute offsets). With a DataPool (consumers) over
        frames only, a leader without a data address being unavailable; without one (Admin,
        the Spark driver: the admin plane) over gRPC."""
        last: RaftMQError | None = None
        for attempt in range(3):
            try:
                address = self._routes.leader(q.topic, q.broker_group, refresh=attempt > 0)
                if self._data is not None:  # a consumer: frames only (its one data transport)
                    data_address = self._routes.data_address(address)
                    if not data_address:
                        raise no_data_address(address)
                    return self._data.call(data_address, method, req, RPC_TIMEOUT_S)
                fn = getattr(self._pool.broker(address), fn_name)  # Admin, Spark's driver
                return fn(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                last = from_rpc_error(exc)
                if not last.retryable:
                    raise last from None
            except RaftMQError as exc:
                last = exc
                if not exc.retryable:
                    raise
        assert last is not None
        raise last

    def committed(self, q: QueueRef) -> int | None:
        req = broker_pb2.QueryOffsetRequest(
            consumer_group=self.group, topic=q.topic, queue_id=q.queue_id
        )
        out = self._call(q, DataMethod.QUERY_OFFSET, "QueryOffset", req)
        assert isinstance(out, broker_pb2.QueryOffsetResponse)
        return None if out.offset < 0 else out.offset

    def bounds(self, q: QueueRef) -> tuple[int, int]:
        req = broker_pb2.GetQueueBoundsRequest(topic=q.topic, queue_id=q.queue_id)
        out = self._call(q, DataMethod.GET_QUEUE_BOUNDS, "GetQueueBounds", req)
        assert isinstance(out, broker_pb2.GetQueueBoundsResponse)
        return out.min_offset, out.max_offset

    def for_timestamp(self, q: QueueRef, timestamp_ms: int) -> int:
        req = broker_pb2.SearchOffsetByTimestampRequest(
            topic=q.topic, queue_id=q.queue_id, timestamp_ms=timestamp_ms
        )
        out = self._call(q, DataMethod.SEARCH_OFFSET_BY_TIMESTAMP, "SearchOffsetByTimestamp", req)
        assert isinstance(out, broker_pb2.SearchOffsetByTimestampResponse)
        return out.offset

    def start_offset(self, q: QueueRef, start_from: StartFrom, committed: int | None) -> int:
        if committed is not None:
            return committed
        low, high = self.bounds(q)
        return low if start_from is StartFrom.EARLIEST else high

    def reset_for(self, q: QueueRef, offset: int, start_from: StartFrom) -> int | None:
        """Where to go on when a pull at `offset` was answered "out of range" (data deleted,
        offsets reset, topic recreated); None when the group's leader, asked now through a fresh
        route, still holds `offset`. The answer may have come from a node behind the leader (a
        stale route naming a follower): a reset on its word would skip or redeliver a queue."""
        self._routes.invalidate(q.topic)
        low, high = self.bounds(q)
        if low <= offset <= high:
            return None
        if offset < low:
            return low  # deleted by retention: go on with the oldest message still stored
        return low if start_from is StartFrom.EARLIEST else high

    def commit(self, offsets: Mapping[QueueRef, int]) -> None:
        """Commit through each broker group's leader (replicated state), one call per group."""
        by_group: dict[str, list[QueueRef]] = {}
        for q in offsets:
            by_group.setdefault(q.broker_group, []).append(q)
        for queues in by_group.values():
            req = broker_pb2.CommitOffsetRequest(
                consumer_group=self.group,
                offsets=[
                    broker_pb2.QueueOffset(topic=q.topic, queue_id=q.queue_id, offset=offsets[q])
                    for q in queues
                ],
            )
            self._call(queues[0], DataMethod.COMMIT_OFFSET, "CommitOffset", req)


class FileOffsets:
    """Broadcasting: each member keeps its own offsets in a JSON file, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: dict[str, int] = {}
        if path.exists():
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise RaftMQError(
                    f"offset file {path} is unreadable ({exc}); fix or delete it"
                ) from exc
            self._offsets = {str(k): int(v) for k, v in raw.items()}

    @staticmethod
    def key(q: QueueRef) -> str:
        return f"{q.topic}@{q.broker_group}#{q.queue_id}"

    def committed(self, q: QueueRef) -> int | None:
        return self._offsets.get(self.key(q))

    def commit(self, offsets: Mapping[QueueRef, int]) -> None:
        changed = False
        for q, off in offsets.items():
            if self._offsets.get(self.key(q)) != off:
                self._offsets[self.key(q)] = off
                changed = True
        if changed:
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        with os.fdopen(fd, "w") as f:
            json.dump(dict(sorted(self._offsets.items())), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def group_queues(queues: Iterable[QueueRef]) -> dict[str, list[QueueRef]]:
    out: dict[str, list[QueueRef]] = {}
    for q in queues:
        out.setdefault(q.broker_group, []).append(q)
    return out
