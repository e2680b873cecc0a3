"""The pull loop of one queue, shared by PullConsumer and PushConsumer: long-polling pulls of
raw record batches from the group's leader (a follower when the leader is away and follower
reads are allowed), a client-side recheck of the tag filter, and a bounded hand-over.

It owns no offsets beyond "where to fetch next"; consumers decide what is committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from raftmq.client.messages import ReceivedMessage
from raftmq.client.raw_batch import decode_batches
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.errors import (
    NotLeaderError,
    OffsetOutOfRangeError,
    RaftMQError,
    from_rpc_error,
)
from raftmq.common.filter.tag import TagFilter, parse_tag_expression
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef

log = logging.getLogger("raftmq.consumer")

MAX_BACKOFF_S = 1.0
FOLLOWER_STICK_S = 5.0  # then the leader is tried again
FOLLOWER_LAG_WAIT_S = 0.1


@dataclass(frozen=True, slots=True)
class FetchSettings:
    group: str
    tag_expression: str = "*"
    sql_expression: str = ""  # SQL92 property filter, evaluated by the broker
    max_messages_per_pull: int = 256
    long_poll_ms: int = 2_000  # short enough to notice a stop or seek promptly
    allow_follower_read: bool = True


@dataclass(frozen=True, slots=True)
class Fetched:
    queue: QueueRef
    epoch: int  # the queue's epoch when fetched: a seek since then makes it stale
    messages: list[ReceivedMessage]
    next_offset: int  # where to fetch after these (filtered-out messages included)


# (queue, the offset pulled) -> the offset to continue from, or None: not out of range after all
OutOfRange = Callable[[QueueRef, int], int | None]


class QueueFetcher:
    """One thread pulling one queue from `offset` on, handing each non-empty answer to `deliver`
    (which may block: that is the back-pressure). stop() ends it; seek() restarts its position."""

    def __init__(
        self,
        queue: QueueRef,
        offset: int,
        settings: FetchSettings,
        routes: RouteCache,
        pool: ChannelPool,
        deliver: Callable[[Fetched], None],
        on_out_of_range: OutOfRange,
    ) -> None:
        self.queue = queue
        self._offset = offset
        self._epoch = 0
        self._settings = settings
        self._routes = routes
        self._pool = pool
        self._deliver = deliver
        self._out_of_range = on_out_of_range
        self._tags: TagFilter = parse_tag_expression(settings.tag_expression or "*")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fetch-{queue}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._settings.long_poll_ms / 1000 + 5)

    @property
    def epoch(self) -> int:
        return self._epoch

    def seek(self, offset: int) -> None:
        with self._lock:
            self._offset = offset
            self._epoch += 1

    def _address(self, use_follower: bool, failures: int) -> str:
        """The leader; after a failed pull (when allowed) a follower, taking turns among them."""
        if use_follower:
            route = self._routes.route(self.queue.topic)
            g = route.group(self.queue.broker_group)
            followers = g.followers if g is not None else ()
            if followers:
                return followers[(failures // 2) % len(followers)]
        return self._routes.leader(self.queue.topic, self.queue.broker_group)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug: say so loudly rather than let the queue go quiet
            log.exception("consumer.fetcher_crashed queue=%s", self.queue)
            raise

    def _loop(self) -> None:
        s = self._settings
        failures = 0
        follower_until = 0.0  # after a follower served, keep reading there until then
        while not self._stop.is_set():
            with self._lock:
                offset, epoch = self._offset, self._epoch
            req = broker_pb2.PullMessageRequest(
                consumer_group=s.group,
                topic=self.queue.topic,
                queue_id=self.queue.queue_id,
                offset=offset,
                max_count=s.max_messages_per_pull,
                filter_type=broker_pb2.SQL92 if s.sql_expression else broker_pb2.TAG,
                filter_expression=s.sql_expression or s.tag_expression,
                max_wait_ms=s.long_poll_ms,
                allow_follower_read=s.allow_follower_read,
                raw_batches=True,
            )
            use_follower = s.allow_follower_read and (
                failures % 2 == 1 or time.monotonic() < follower_until
            )
            try:
                address = self._address(use_follower, failures)
                resp = self._pool.broker(address).PullMessage(
                    req, timeout=s.long_poll_ms / 1000 + 5
                )
                stored = decode_batches(resp.batches, self.queue.broker_group, self.queue.queue_id)
                messages = [ReceivedMessage.from_stored(m) for m in stored]
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, OffsetOutOfRangeError):
                    if use_follower and (err.max_offset or 0) < offset:
                        # A follower behind the leader: not the end of the queue, just its
                        # view; it catches up (never reset a position on a follower's word).
                        self._stop.wait(FOLLOWER_LAG_WAIT_S)
                        continue
                    if not self._reset_position(offset, epoch, err):
                        failures = self._backoff(None, failures)
                    continue
                failures = self._backoff(err, failures)
                continue
            except RaftMQError as err:  # no route or no leader known
                failures = self._backoff(err, failures)
                continue
            except Exception as exc:  # a batch that does not decode: never skip it silently
                log.error(
                    "consumer.fetch_failed queue=%s offset=%d error=%s", self.queue, offset, exc
                )
                failures = self._backoff(None, failures)
                continue
            if resp.status == broker_pb2.OFFSET_ILLEGAL:  # the status form of the same answer
                if use_follower and resp.max_offset < offset:
                    self._stop.wait(FOLLOWER_LAG_WAIT_S)
                    continue
                illegal = OffsetOutOfRangeError.for_offset(
                    self.queue.topic,
                    self.queue.queue_id,
                    offset,
                    resp.min_offset,
                    resp.max_offset,
                )
                if not self._reset_position(offset, epoch, illegal):
                    failures = self._backoff(None, failures)
                continue
            if use_follower and failures:
                # The leader failed and a follower serves: stay there a while rather than
                # paying a failed leader pull for every answer.
                follower_until = time.monotonic() + FOLLOWER_STICK_S
            failures = 0
            if not self._tags.is_all:
                messages = [m for m in messages if self._tags.matches(m.tags)]  # hash collisions
            with self._lock:
                if self._epoch != epoch:
                    continue  # seeked meanwhile
                self._offset = resp.next_offset
            if messages:
                self._deliver(Fetched(self.queue, epoch, messages, resp.next_offset))

    def _reset_position(self, offset: int, epoch: int, err: OffsetOutOfRangeError) -> bool:
        """The offset fell outside the queue: go on where the consumer's policy says. False if
        that could not be found out now (the caller backs off and pulls again)."""
        try:
            new = self._out_of_range(self.queue, offset)
        except RaftMQError as exc:
            log.warning("consumer.offset_reset_failed queue=%s error=%s", self.queue, exc.message)
            return False
        if new is None:
            log.info(
                "consumer.offset_in_range queue=%s offset=%d: %s, but the leader holds it",
                self.queue,
                offset,
                err.message,
            )
            return False
        log.warning(
            "consumer.offset_out_of_range queue=%s offset=%d reset_to=%d (%s)",
            self.queue,
            offset,
            new,
            err.message,
        )
        with self._lock:
            if self._epoch == epoch:
                self._offset = new
        return True

    def _backoff(self, err: RaftMQError | None, failures: int) -> int:
        failures += 1
        if isinstance(err, NotLeaderError) or err is None or err.retryable:
            self._routes.invalidate(self.queue.topic)
        if err is not None and not err.retryable:
            log.warning("consumer.pull_failed queue=%s error=%s", self.queue, err.message)
        self._stop.wait(min(MAX_BACKOFF_S, 0.05 * (2 ** min(failures, 5))))
        return failures
