"""The pull loop of one queue, shared by PullConsumer and PushConsumer: long-polling pulls of
raw record batches from the group's leader (a follower when the leader is away and follower
reads are allowed), a client-side recheck of the tag filter, and a bounded hand-over.

No thread waits on a pull: each pull is a future of the framed data path (the SDK's one data
transport) whose answer is handed to the consumer's FetchDriver, a few threads
shared by all its queues; a queue whose consumer has no room pauses until woken. It owns no
offsets beyond "where to fetch next"; consumers decide what is committed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import Message

from raftmq.client.data_pool import DataPool, no_data_address
from raftmq.client.messages import ReceivedMessage
from raftmq.client.raw_batch import received_messages
from raftmq.client.routes import RouteCache
from raftmq.client.scheduler import Scheduler
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    ConsumeDisabledError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    RaftMQError,
)
from raftmq.common.filter.tag import TagFilter, parse_tag_expression
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef

log = logging.getLogger("raftmq.consumer")

MAX_BACKOFF_S = 1.0
FOLLOWER_STICK_S = 5.0  # then the leader is tried again
FOLLOWER_LAG_WAIT_S = 0.1
PAUSE_RECHECK_S = 0.05  # a paused queue looks for room this often even if nobody wakes it
PULL_TIMEOUT_MARGIN_S = 5.0  # past the long poll before a pull counts as lost
DEFAULT_DRIVER_THREADS = 2
# An empty answer to a long poll in under this share of it: the broker did not hold the pull
# (a gRPC broker with all its hold threads taken answers at once; a closing one too). The next
# pull waits that long (at most EARLY_EMPTY_MAX_S) instead of asking again at once.
EARLY_EMPTY_SHARE = 0.5
EARLY_EMPTY_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class FetchSettings:
    group: str
    tag_expression: str = "*"
    sql_expression: str = ""  # SQL92 property filter, evaluated by the broker
    max_messages_per_pull: int = 256
    long_poll_ms: int = 2_000  # short enough to notice a stop or seek promptly
    allow_follower_read: bool = True
    broadcasting: bool = False  # the broker refuses it for a group whose config turns it off


@dataclass(frozen=True, slots=True)
class Fetched:
    queue: QueueRef
    epoch: int  # the queue's epoch when fetched: a seek since then makes it stale
    messages: list[ReceivedMessage]
    next_offset: int  # where to fetch after these (filtered-out messages included)


# (queue, the offset pulled) -> the offset to continue from, or None: not out of range after all
OutOfRange = Callable[[QueueRef, int], int | None]
# Takes a fetch without blocking (the consumer buffers it).
Deliver = Callable[[Fetched], None]
# Whether the consumer wants more now; a fetcher without room pauses until wake() or a recheck.
HasRoom = Callable[[], bool]
# Told of a pull the brokers refuse to this user or group (PermissionDeniedError: the ACL, the
# group's config); the fetcher keeps retrying with its back-off, the consumer may raise it.
Refused = Callable[[PermissionDeniedError], None]


class PullGate(Protocol):
    """Paces the pulls of all of one consumer's queues while its group's consuming is turned
    off (client/group_refusal.py; thread-safe: every queue's steps call it)."""

    def pull_delay_s(self) -> float:
        """0: pull now; else ask again after this many seconds."""
        ...

    def refused(self, error: ConsumeDisabledError, sent_s: float) -> None: ...

    def served(self, sent_s: float) -> None:
        """A pull sent at `sent_s` (time.monotonic) was answered."""
        ...


class FetchDriver:
    """The threads that run every fetcher step of one consumer: decoding, handing over, route
    look-ups and offset resets (which may block), and timers for back-offs. Bounded: `threads`
    workers whatever the number of queues; no step waits for a pull's answer."""

    def __init__(self, name: str, threads: int = DEFAULT_DRIVER_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._timer = Scheduler(f"{name}-timer")
        self._closed = False

    def run(self, step: Callable[[], None]) -> None:
        if self._closed:
            return
        # Shut down meanwhile: closing, the consumer no longer wants anything fetched.
        with contextlib.suppress(RuntimeError):
            self._pool.submit(self._guarded, step)

    def later(self, delay_s: float, step: Callable[[], None]) -> None:
        self._timer.call_later(delay_s, lambda: self.run(step))

    @staticmethod
    def _guarded(step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # a bug: say so loudly rather than let a queue go quiet
            log.exception("consumer.fetch_step_crashed")

    def close(self) -> None:
        self._closed = True
        self._timer.close()
        self._pool.shutdown(wait=True, cancel_futures=True)


class QueueFetcher:
    """Pulls one queue from `offset` on, handing each non-empty answer to `deliver` while
    `has_room()`; stop() ends it; seek() restarts its position; wake() resumes it when room
    frees. One pull (or one timer) at a time; its steps run on the driver's threads."""

    def __init__(
        self,
        queue: QueueRef,
        offset: int,
        settings: FetchSettings,
        routes: RouteCache,
        deliver: Deliver,
        on_out_of_range: OutOfRange,
        *,
        driver: FetchDriver,
        data: DataPool,
        has_room: HasRoom = lambda: True,
        on_refused: Refused | None = None,
        gate: PullGate | None = None,
    ) -> None:
        """`gate`: a ConsumeDisabledError goes there, not to the log per pull, and it decides
        when this queue pulls again."""
        self.queue = queue
        self._on_refused = on_refused
        self._gate = gate
        self._offset = offset
        self._epoch = 0
        self._settings = settings
        self._routes = routes
        self._data = data
        self._driver = driver
        self._deliver = deliver
        self._has_room = has_room
        self._out_of_range = on_out_of_range
        self._tags: TagFilter = parse_tag_expression(settings.tag_expression or "*")
        self._lock = threading.Lock()  # guards offset, epoch, paused
        self._step_lock = threading.Lock()  # one step of this fetcher at a time
        self._stopped = False
        self.throttle_ms = 0  # ms brokers held our pulls for this user's consume quota (issue 27)
        self._paused = False
        self._failures = 0
        self._follower_until = 0.0  # after a follower served, keep reading there until then
        self._pull_started = 0.0  # when the pull in flight was sent (one at a time)
        self.pulls = 0

    def start(self) -> None:
        self._driver.run(self._pull)

    def stop(self, join: bool = True) -> None:
        """No delivery starts after this returns with `join` (one running may finish first)."""
        self._stopped = True  # an answer still on its way is dropped by _step
        if join:
            with self._step_lock:
                pass

    def wake(self) -> None:
        """The consumer has room again: resume a paused fetcher at once."""
        with self._lock:
            if not self._paused:
                return
            self._paused = False
        self._driver.run(self._pull)

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

    # ---- steps (driver threads) ---------------------------------------------------------------

    def _pull(self) -> None:
        with self._step_lock:
            if self._stopped:
                return
            if not self._has_room():
                with self._lock:
                    self._paused = True
                self._driver.later(PAUSE_RECHECK_S, self.wake)
                return
            delay_s = self._gate.pull_delay_s() if self._gate is not None else 0.0
            if delay_s > 0:
                self._driver.later(delay_s, self._pull)
                return
            self._start_pull()

    def _start_pull(self) -> None:
        s = self._settings
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
            broadcasting=s.broadcasting,
        )
        use_follower = s.allow_follower_read and (
            self._failures % 2 == 1 or time.monotonic() < self._follower_until
        )
        timeout_s = s.long_poll_ms / 1000 + PULL_TIMEOUT_MARGIN_S
        try:
            address = self._address(use_follower, self._failures)
        except RaftMQError as err:  # no route or no leader known
            self._backoff(err)
            return
        self.pulls += 1
        self._pull_started = time.monotonic()
        data_address = self._routes.data_address(address)
        if not data_address:
            self._backoff(no_data_address(address))
            return
        fut = self._data.submit(data_address, DataMethod.PULL_MESSAGE, req, timeout_s)
        fut.add_done_callback(
            lambda f: self._driver.run(
                lambda: self._on_frame_answer(f, offset, epoch, use_follower)
            )
        )

    def _on_frame_answer(
        self,
        fut: concurrent.futures.Future[Message],
        offset: int,
        epoch: int,
        use_follower: bool,
    ) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None:
            err = (
                exc
                if isinstance(exc, RaftMQError)
                else BrokerUnavailableError(f"pull of {self.queue} failed: {exc!r}")
            )
            self._step(None, err, offset, epoch, use_follower)
            return
        resp = fut.result()
        assert isinstance(resp, broker_pb2.PullMessageResponse)
        self.throttle_ms += resp.throttle_ms
        self._step(resp, None, offset, epoch, use_follower)

    def _step(
        self,
        resp: broker_pb2.PullMessageResponse | None,
        err: RaftMQError | None,
        offset: int,
        epoch: int,
        use_follower: bool,
    ) -> None:
        with self._step_lock:
            if self._stopped:
                return
            wait_s = self._handle(resp, err, offset, epoch, use_follower)
        if wait_s is None:
            return  # a back-off timer is set
        if wait_s > 0:
            self._driver.later(wait_s, self._pull)
        else:
            self._pull()

    def _handle(
        self,
        resp: broker_pb2.PullMessageResponse | None,
        err: RaftMQError | None,
        offset: int,
        epoch: int,
        use_follower: bool,
    ) -> float | None:
        """One answer through the fetch state machine; how long to wait before the next pull
        (None: a back-off timer was set)."""
        if err is not None:
            if isinstance(err, OffsetOutOfRangeError):
                if use_follower and (err.max_offset or 0) < offset:
                    # A follower behind the leader: not the end of the queue, just its
                    # view; it catches up (never reset a position on a follower's word).
                    return FOLLOWER_LAG_WAIT_S
                if not self._reset_position(offset, epoch, err):
                    self._backoff(None)
                    return None
                return 0.0
            self._backoff(err)
            return None
        assert resp is not None
        if self._gate is not None:
            self._gate.served(self._pull_started)
        try:
            # v2 batches: checked here (the offsets against the request and the answer too),
            # each message's fields decoded only when read
            messages = received_messages(
                resp.batches,
                self.queue.broker_group,
                self.queue.queue_id,
                offsets=(offset, resp.next_offset),
            )
            if not self._tags.is_all:  # hash collisions; a tag that does not decode fails here
                messages = [m for m in messages if self._tags.matches(m.tags)]
        except Exception as exc:  # a batch that does not decode or match: never skip it silently
            log.error("consumer.fetch_failed queue=%s offset=%d error=%s", self.queue, offset, exc)
            self._backoff(None)
            return None
        if resp.status == broker_pb2.OFFSET_ILLEGAL:  # the status form of the same answer
            if use_follower and resp.max_offset < offset:
                return FOLLOWER_LAG_WAIT_S
            illegal = OffsetOutOfRangeError.for_offset(
                self.queue.topic,
                self.queue.queue_id,
                offset,
                resp.min_offset,
                resp.max_offset,
            )
            if not self._reset_position(offset, epoch, illegal):
                self._backoff(None)
                return None
            return 0.0
        if use_follower and self._failures:
            # The leader failed and a follower serves: stay there a while rather than
            # paying a failed leader pull for every answer.
            self._follower_until = time.monotonic() + FOLLOWER_STICK_S
        self._failures = 0
        with self._lock:
            if self._epoch != epoch:
                return 0.0  # seeked meanwhile
            self._offset = resp.next_offset
        if messages:
            self._deliver(Fetched(self.queue, epoch, messages, resp.next_offset))
            return 0.0
        hold_s = self._settings.long_poll_ms / 1000
        if (
            resp.status == broker_pb2.NO_NEW_MSG
            and time.monotonic() - self._pull_started < EARLY_EMPTY_SHARE * hold_s
        ):
            return min(EARLY_EMPTY_MAX_S, EARLY_EMPTY_SHARE * hold_s)  # not held: no spinning
        return 0.0

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
        if err.deleted_by_retention:
            log.warning(
                "consumer.deleted_by_retention queue=%s offset=%d lost_messages=%s reset_to=%d "
                "(%s)",
                self.queue,
                offset,
                err.details.get("lost_messages", "?"),
                new,
                err.message,
            )
        else:
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

    def _backoff(self, err: RaftMQError | None) -> None:
        """Count a failed pull and pull again after a growing pause."""
        self._failures += 1
        failures = self._failures
        if isinstance(err, NotLeaderError) or err is None or err.retryable:
            self._routes.invalidate(self.queue.topic)
        if isinstance(err, ConsumeDisabledError) and self._gate is not None:
            self._gate.refused(err, self._pull_started)  # said once per episode, not per pull
        elif err is not None and not err.retryable:
            log.warning("consumer.pull_failed queue=%s error=%s", self.queue, err.message)
            if isinstance(err, PermissionDeniedError) and self._on_refused is not None:
                self._on_refused(err)
        self._driver.later(min(MAX_BACKOFF_S, 0.05 * (2 ** min(failures, 5))), self._pull)
