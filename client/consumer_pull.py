"""PullConsumer: the application assigns queues (or subscribes to a topic), seeks, and polls;
fetchers prefetch ahead into a bounded buffer (pulls are futures driven by a few shared threads,
over frames where a node offers them). Offsets are committed only when asked (commit()), to the
broker group as replicated state."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from raftmq.client.data_pool import DataPool
from raftmq.client.fetcher import FetchDriver, Fetched, FetchSettings, QueueFetcher
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import BrokerOffsets, StartFrom
from raftmq.client.refusal_gate import RefusalGate
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common import tls
from raftmq.common.arguments import checked
from raftmq.common.auth import Credentials
from raftmq.common.errors import (
    ConsumeDisabledError,
    InvalidArgumentError,
    PermissionDeniedError,
    RaftMQError,
)
from raftmq.common.filter.subscription import check_subscription
from raftmq.common.message import dlq_topic, retry_topic, validate_group, validate_topic
from raftmq.common.types import QueueRef, check_offset

MAX_POLL_TIMEOUT_MS = 86_400_000  # the longest single poll() wait


class PullConsumer:
    """Thread-safe for one polling thread plus any number of seek/commit callers."""

    @checked
    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        group: str,
        *,
        start_from: StartFrom = StartFrom.LATEST,
        tag_expression: str = "*",
        sql_expression: str = "",
        max_prefetch_messages: int = 20_000,
        max_messages_per_pull: int = 1024,
        long_poll_ms: int = 2_000,
        allow_follower_read: bool = True,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        validate_group(group)
        if max_prefetch_messages < 1 or max_messages_per_pull < 1 or long_poll_ms < 0:
            raise InvalidArgumentError(
                "max_prefetch_messages and max_messages_per_pull must be >= 1, long_poll_ms >= 0"
            )
        check_subscription(tag_expression, sql_expression)
        self.group = group
        self._tls = tls.client_tls(tls_ca, tls_cert, tls_key)  # RAFTMQ_TLS_* if none
        self._pool = ChannelPool(tls_config=self._tls, credentials=credentials)
        self._data = DataPool(
            tls_config=self._tls, name="raftmq-consumer-data", credentials=credentials
        )
        self._driver = FetchDriver("raftmq-fetch")
        self.routes = RouteCache(namesrv_addresses, self._pool)
        self._offsets = BrokerOffsets(group, self.routes, self._pool, self._data)
        self._start_from = start_from
        self._settings = FetchSettings(
            group,
            tag_expression,
            sql_expression,
            max_messages_per_pull,
            long_poll_ms,
            allow_follower_read,
        )
        self._max_prefetch = max_prefetch_messages
        self._cond = threading.Condition()
        self._buffer: collections.deque[Fetched] = collections.deque()
        self._buffered = 0
        self._fetchers: dict[QueueRef, QueueFetcher] = {}
        self._positions: dict[QueueRef, int] = {}  # next offset poll() will return per queue
        self._committer: ThreadPoolExecutor | None = None  # commit_async's one thread
        self._closed = False
        # Called (on a fetch thread, never blocking) after each delivery: client/aio.py's wake-up.
        self._on_data: Callable[[], None] | None = None
        # A pull the brokers refused (the ACL, the group's config turning consuming off): the
        # next poll() with nothing buffered raises it, as Kafka's poll raises an authorization
        # error; the fetchers keep retrying, so consuming resumes once it is allowed again.
        self._refused: PermissionDeniedError | None = None
        # Consuming turned off for the group: poll() raises it once per episode, the log says
        # it once, and all queues together pull once per back-off (as the push consumer does).
        self._gate = RefusalGate(group, self._on_refused)

    # ---- assignment ---------------------------------------------------------------------------

    def _own_system_topic(self, topic: str) -> bool:
        """A group may read its own retry and dead-letter topics (e.g. to inspect them)."""
        return topic in (retry_topic(self.group), dlq_topic(self.group))

    def queues_of(self, topic: str) -> list[QueueRef]:
        validate_topic(topic, allow_system=self._own_system_topic(topic))
        return self.routes.route(topic, refresh=True).read_queues()

    @checked
    def subscribe(self, topic: str) -> list[QueueRef]:
        """Assign every readable queue of `topic` (on every broker group)."""
        queues = self.queues_of(topic)
        self.assign([*self._fetchers, *queues])
        return queues

    @checked
    def assign(self, queues: Iterable[QueueRef]) -> None:
        wanted = set(queues)
        for q in wanted:
            if not isinstance(q, QueueRef):
                raise InvalidArgumentError(
                    f"assign() takes QueueRef values (from queues_of(topic)), not "
                    f"{type(q).__name__}",
                    details={"argument": "queues"},
                )
            validate_topic(q.topic, allow_system=self._own_system_topic(q.topic))
        for q in [q for q in self._fetchers if q not in wanted]:
            self._fetchers.pop(q).stop()
            self._positions.pop(q, None)
        for q in sorted(wanted - set(self._fetchers)):
            start = self._offsets.start_offset(q, self._start_from, self._offsets.committed(q))
            self._positions[q] = start
            f = QueueFetcher(
                q,
                start,
                self._settings,
                self.routes,
                self._deliver,
                self._reset,
                driver=self._driver,
                has_room=self._has_room,
                data=self._data,
                on_refused=self._on_refused,
                gate=self._gate,
            )
            self._fetchers[q] = f
            f.start()

    @property
    def throttle_ms(self) -> int:
        """How long brokers have held this consumer's pulls for its user's consume quota
        (issue 27), in total over the queues it holds now."""
        return sum(f.throttle_ms for f in list(self._fetchers.values()))

    def assignment(self) -> list[QueueRef]:
        return sorted(self._fetchers)

    def _fetcher(self, q: QueueRef) -> QueueFetcher:
        f = self._fetchers.get(q)
        if f is None:
            raise InvalidArgumentError(f"queue {q} is not assigned to this consumer")
        return f

    # ---- positions ----------------------------------------------------------------------------

    @checked
    def seek(self, q: QueueRef, offset: int) -> None:
        check_offset(offset, "offset")
        f = self._fetcher(q)
        with self._cond:
            self._positions[q] = offset
            f.seek(offset)

    @checked
    def seek_to_beginning(self, q: QueueRef) -> None:
        self.seek(q, self._offsets.bounds(q)[0])

    @checked
    def seek_to_end(self, q: QueueRef) -> None:
        self.seek(q, self._offsets.bounds(q)[1])

    @checked
    def seek_to_timestamp(self, q: QueueRef, timestamp_ms: int) -> None:
        self._fetcher(q)
        check_offset(timestamp_ms, "timestamp_ms")
        self.seek(q, self._offsets.for_timestamp(q, timestamp_ms))

    def position(self, q: QueueRef) -> int:
        self._fetcher(q)
        return self._positions[q]

    def committed(self, q: QueueRef) -> int | None:
        return self._offsets.committed(q)

    def commit(self) -> None:
        """Commit the position of every assigned queue (what poll() has returned so far)."""
        with self._cond:
            offsets = dict(self._positions)
        self._offsets.commit(offsets)

    def commit_async(
        self, callback: Callable[[RaftMQError | None], None] | None = None
    ) -> Future[None]:
        """commit() on a background thread: the positions as of now, committed in call order.
        The future fails with the typed error; `callback` gets it (or None) when done."""
        with self._cond:
            if self._closed:
                raise InvalidArgumentError("the consumer is closed")
            offsets = dict(self._positions)
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="raftmq-commit")
        fut = self._committer.submit(self._offsets.commit, offsets)
        if callback is not None:

            def done(f: Future[None]) -> None:
                exc = f.exception()
                callback(
                    exc if isinstance(exc, RaftMQError) or exc is None else RaftMQError(str(exc))
                )

            fut.add_done_callback(done)
        return fut

    # ---- polling ------------------------------------------------------------------------------

    def _has_room(self) -> bool:
        # Unlocked read of an int: a stale answer costs one pull more or a recheck later.
        return self._buffered < self._max_prefetch and not self._closed

    def _deliver(self, fetched: Fetched) -> None:
        # Never blocks (it runs on a fetch driver thread): the fetchers pause on _has_room, so
        # the buffer passes max_prefetch_messages by at most one pull per queue.
        with self._cond:
            if self._closed:
                return
            self._buffer.append(fetched)
            self._buffered += len(fetched.messages)
            self._cond.notify_all()
        if self._on_data is not None:
            self._on_data()

    def _on_refused(self, err: PermissionDeniedError) -> None:
        with self._cond:
            self._refused = err
            self._cond.notify_all()
        if self._on_data is not None:
            self._on_data()

    def _reset(self, q: QueueRef, offset: int) -> int | None:
        """The fetch offset fell outside the queue: go on from the bound the policy names."""
        new = self._offsets.reset_for(q, offset, self._start_from)
        if new is None:
            return None
        with self._cond:
            if q in self._positions and not any(f.queue == q for f in self._buffer):
                self._positions[q] = new  # nothing of q waits to be polled: commit the new spot
        return new

    @property
    def consume_disabled(self) -> ConsumeDisabledError | None:
        """Why the group's pulls are refused now (its config turns consuming off), or None
        while it consumes."""
        return self._gate.state.error

    @checked
    def poll(self, timeout_ms: int = 1_000, max_messages: int = 10_000) -> list[ReceivedMessage]:
        """Messages in offset order per queue; [] if none arrives within timeout_ms. Raises
        the PermissionDeniedError of a pull the brokers refused when nothing is buffered: once
        per refusal, and a ConsumeDisabledError (the group's config turns consuming off) once
        per episode, while the fetchers keep probing and consuming resumes by itself."""
        if not 0 <= timeout_ms <= MAX_POLL_TIMEOUT_MS:
            # Bounded like every wait: past a day a caller loops, and past threading's limit
            # the wait itself would fail with an OverflowError.
            raise InvalidArgumentError(
                f"poll: timeout_ms must be between 0 and {MAX_POLL_TIMEOUT_MS} (one day), "
                f"got {timeout_ms}; call poll in a loop to wait longer",
                details={"argument": "timeout_ms"},
            )
        deadline = time.monotonic() + timeout_ms / 1000
        out: list[ReceivedMessage] = []
        with self._cond:
            while not self._buffer:
                if self._refused is not None:
                    refused, self._refused = self._refused, None
                    raise refused
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return out
                self._cond.wait(left)
            while self._buffer and len(out) < max_messages:
                fetched = self._buffer[0]
                f = self._fetchers.get(fetched.queue)
                if f is None or f.epoch != fetched.epoch:
                    self._buffer.popleft()  # unassigned or seeked since it was fetched
                    self._buffered -= len(fetched.messages)
                    continue
                room = max_messages - len(out)
                take = fetched.messages[:room]
                out.extend(take)
                if len(take) == len(fetched.messages):
                    self._buffer.popleft()
                    self._positions[fetched.queue] = fetched.next_offset
                else:
                    self._buffer[0] = Fetched(
                        fetched.queue, fetched.epoch, fetched.messages[room:], fetched.next_offset
                    )
                    self._positions[fetched.queue] = take[-1].queue_offset + 1
                self._buffered -= len(take)
            self._cond.notify_all()
            room = self._buffered < self._max_prefetch
            fetchers = list(self._fetchers.values()) if room and out else []
        for f in fetchers:
            f.wake()
        return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for f in self._fetchers.values():
            f.stop(join=False)
        for f in self._fetchers.values():
            f.stop()
        self._fetchers.clear()
        self._driver.close()
        if self._committer is not None:
            self._committer.shutdown(wait=True)  # commits already asked for still happen
        self._data.close()
        self._pool.close()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
