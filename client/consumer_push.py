"""PushConsumer: a listener called for every message, on a bounded pool of threads.

Clustering: the group's members (heartbeats to every node of every broker group) share the
topic's queues by a deterministic allocation, recomputed every rebalance period; offsets are
committed to the broker groups. Broadcasting: every member reads every queue and keeps its own
offsets in a local file. A queue's committed offset never passes a message whose listener has
not returned SUCCESS (RocketMQ's ProcessQueue): a crash redelivers, never skips. Pulls, offsets
and heartbeats go over the framed data path where a node offers one, gRPC otherwise.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import grpc

from raftmq.client.data_pool import DataPool
from raftmq.client.fetcher import FetchDriver, Fetched, FetchSettings, QueueFetcher
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offset_reset import SeenResets
from raftmq.client.offsets import BrokerOffsets, FileOffsets, StartFrom
from raftmq.client.process_queue import ProcessQueue
from raftmq.client.rebalance import AllocationStrategy, allocate, plan_rebalance
from raftmq.client.refusal_gate import DisabledCallback, RefusalGate
from raftmq.client.retry_back import SendBack, listener_view
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.client.scheduler import Scheduler
from raftmq.client.trace import TraceSender, traced_listener
from raftmq.common import tls
from raftmq.common.arguments import checked
from raftmq.common.auth import Credentials
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    AccessDeniedError,
    ConsumeDisabledError,
    InvalidArgumentError,
    RaftMQError,
    from_rpc_error,
)
from raftmq.common.filter.subscription import check_subscription
from raftmq.common.message import retry_topic, validate_group, validate_topic
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef

log = logging.getLogger("raftmq.consumer")

MAX_INTERVAL_MS = 86_400_000  # the longest rebalance / heartbeat / commit interval a consumer takes
MAX_RECONSUME_DELAY_MS = 30_000  # default cap of the retry back-off (max_reconsume_backoff_ms)


class ConsumeResult(enum.Enum):
    SUCCESS = "success"
    RECONSUME_LATER = "reconsume_later"


class MessageModel(enum.Enum):
    CLUSTERING = "clustering"
    BROADCASTING = "broadcasting"


Listener = Callable[[ReceivedMessage], "ConsumeResult | None"]


@dataclass(frozen=True, slots=True)
class StuckMessage:
    """A message whose listener failed `attempts` times, reaching max_reconsume_times, and that
    could not be sent back to the broker (retry or dead-letter topic; or a broadcasting
    consumer, which never sends back). It is kept, never skipped: its queue's committed offset
    stays before it, and it is retried every max_reconsume_backoff_ms until the listener
    succeeds or a send-back does."""

    message: ReceivedMessage
    attempts: int
    error: str  # the listener's exception, or "RECONSUME_LATER"


StuckCallback = Callable[[StuckMessage], None]


class PushConsumer:
    @checked
    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        group: str,
        topic: str,
        listener: Listener,
        *,
        tag_expression: str = "*",
        sql_expression: str = "",
        message_model: MessageModel = MessageModel.CLUSTERING,
        allocation: AllocationStrategy = AllocationStrategy.AVERAGELY,
        start_from: StartFrom = StartFrom.LATEST,
        consume_threads: int = 8,
        max_inflight_per_queue: int = 1_000,
        rebalance_interval_ms: int = 20_000,
        heartbeat_interval_ms: int = 10_000,
        commit_interval_ms: int = 1_000,
        max_reconsume_times: int = 16,
        reconsume_backoff_ms: int = 1_000,
        max_reconsume_backoff_ms: int = MAX_RECONSUME_DELAY_MS,
        retry_delay_level: int = 0,
        long_poll_ms: int = 2_000,
        offset_file: Path | None = None,
        client_id: str | None = None,
        on_stuck: StuckCallback | None = None,
        on_consume_disabled: DisabledCallback | None = None,
        trace: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        validate_group(group)
        validate_topic(topic)
        check_subscription(tag_expression, sql_expression)
        if consume_threads < 1 or max_inflight_per_queue < 1:
            raise InvalidArgumentError("consume_threads and max_inflight_per_queue must be >= 1")
        intervals = (rebalance_interval_ms, heartbeat_interval_ms, commit_interval_ms)
        if min(intervals) < 1 or max(intervals) > MAX_INTERVAL_MS:
            # The upper bound keeps the broker's heartbeat expiry (3 intervals) in its uint32.
            raise InvalidArgumentError(
                "rebalance_interval_ms, heartbeat_interval_ms and commit_interval_ms must be "
                f"between 1 ms and {MAX_INTERVAL_MS} ms (one day), got {intervals}"
            )
        self.group = group
        self.topic = topic
        self.client_id = client_id or f"{uuid.uuid4().hex[:12]}"
        self._listener = listener
        # Message trace (issue 16): a ConsumeTrace per listener call, sent by client/trace.py.
        self._tracer = TraceSender(namesrv_addresses) if trace else None
        if self._tracer is not None:
            self._listener = traced_listener(listener, self._tracer, group, self.client_id)
        self._model = message_model
        self._allocation = allocation
        self._start_from = start_from
        self._max_inflight = max_inflight_per_queue
        self._rebalance_s = rebalance_interval_ms / 1000
        self._heartbeat_ms = heartbeat_interval_ms
        self._commit_s = commit_interval_ms / 1000
        if max_reconsume_times < 0:
            raise InvalidArgumentError("max_reconsume_times must be >= 0")
        self._max_reconsume = max_reconsume_times
        if retry_delay_level < 0:
            raise InvalidArgumentError("retry_delay_level must be >= 0 (0: the broker's back-off)")
        # RocketMQ's delayLevelWhenNextConsume: 0 lets the broker back off (level 3 + count).
        self._retry_delay_level = retry_delay_level
        self._on_stuck = on_stuck
        self._on_consume_disabled = on_consume_disabled
        self._gate = RefusalGate(group, self._tell_disabled)
        self._stuck: dict[str, StuckMessage] = {}  # msg_id -> past its retry limit, kept
        self._reconsume_backoff_s = reconsume_backoff_ms / 1000
        self._max_backoff_s = max_reconsume_backoff_ms / 1000
        self._tls = tls.client_tls(tls_ca, tls_cert, tls_key)  # RAFTMQ_TLS_* if none
        self._pool = ChannelPool(tls_config=self._tls, credentials=credentials)
        self._data = DataPool(
            tls_config=self._tls, name="raftmq-consumer-data", credentials=credentials
        )
        self._driver = FetchDriver("raftmq-fetch")
        self.routes = RouteCache(namesrv_addresses, self._pool)
        self._broker_offsets = BrokerOffsets(group, self.routes, self._pool, self._data)
        self._file_offsets: FileOffsets | None = None
        if message_model is MessageModel.BROADCASTING:
            path = offset_file or Path.home() / ".raftmq" / "offsets" / f"{group}.{topic}.json"
            self._file_offsets = FileOffsets(path)
        self._settings = FetchSettings(
            group,
            tag_expression,
            sql_expression,
            256,
            long_poll_ms,
            True,
            broadcasting=message_model is MessageModel.BROADCASTING,
        )
        # Clustering: a failed message goes back to the broker (%RETRY%<group>, then %DLQ%) and
        # the consumer reads its retry topic beside its own, with no filter (RocketMQ's way).
        self._retry_topic = retry_topic(group) if message_model is MessageModel.CLUSTERING else ""
        self._retry_settings = FetchSettings(group, "*", "", 256, long_poll_ms, True)
        self._send_back = SendBack(group, self.routes, self._pool, self._tracer)
        self._executor = ThreadPoolExecutor(consume_threads, thread_name_prefix="consume")
        self._scheduler = Scheduler("raftmq-consumer-timer")
        # Heartbeats on their own thread: a slow rebalance must not let membership expire.
        self._heartbeats = Scheduler("raftmq-consumer-heartbeat")
        self._lock = threading.Condition()
        self._fetchers: dict[QueueRef, QueueFetcher] = {}
        self._pqs: dict[QueueRef, ProcessQueue] = {}
        self._committed: dict[QueueRef, int] = {}  # what this member last committed per queue
        self._rebalance_lock = threading.Lock()
        self._members_seen: list[str] | None = None  # the membership the assignment is for
        self._resets = SeenResets()  # administrative resets followed (from heartbeat answers)
        self._started = False
        self._closed = False
        self.rebalances = 0

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PushConsumer:
        if self._started:
            return self
        self._started = True
        try:
            self.routes.route(self.topic)  # fail fast on an unknown topic
        except RaftMQError:
            self._closed = True  # nothing started yet: release the threads and channels
            self._release_unstarted()
            raise
        if self._model is MessageModel.CLUSTERING:
            try:
                # The first heartbeat asks for Sub on the group and the topic: a group this user
                # may not use fails here, typed, not as a WARNING per queue afterwards.
                self._heartbeat(starting=True)
            except (AccessDeniedError, ConsumeDisabledError):
                self._closed = True
                self._release_unstarted()
                raise
            self._heartbeats.every(self._heartbeat_ms / 1000, self._heartbeat)
        self.rebalance()
        self._scheduler.every(self._rebalance_s, self.rebalance)
        self._scheduler.every(self._commit_s, self.commit)
        return self

    def _release_unstarted(self) -> None:
        """A start that failed: the threads and channels go, nothing else had begun."""
        self._scheduler.close()
        self._heartbeats.close()
        self._driver.close()
        self._executor.shutdown(wait=False)
        self._data.close()
        self._pool.close()
        if self._tracer is not None:
            self._tracer.close()

    def close(self) -> None:
        """Stop fetching, let running listeners finish, commit, leave the group."""
        if self._closed:
            return
        self._closed = True
        self._scheduler.close()
        self._heartbeats.close()
        for f in self._fetchers.values():
            f.stop(join=False)
        for f in self._fetchers.values():
            f.stop()
        self._driver.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        try:
            self.commit()
        except RaftMQError as exc:
            log.warning("consumer.final_commit_failed error=%s", exc.message)
        if self._model is MessageModel.CLUSTERING:
            self._heartbeat(leaving=True)
        if self._tracer is not None:
            self._tracer.close()
        self._data.close()
        self._pool.close()

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def assignment(self) -> list[QueueRef]:
        return sorted(self._fetchers)

    # ---- membership and rebalance -------------------------------------------------------------

    def _all_nodes(self) -> list[str]:
        route = self.routes.route(self.topic)
        return sorted({a for g in route.groups.values() for a in g.addresses})

    def _heartbeat(self, leaving: bool = False, starting: bool = False) -> None:
        """Tell every node of the topic's groups that this member is here (or leaving). When
        `starting`, a node's AccessDeniedError is raised (the user may not use the group or the
        topic), and ConsumeDisabledError when the group's config turns consuming off; otherwise
        a node that does not answer is skipped."""
        req = broker_pb2.HeartbeatRequest(
            consumer_group=self.group,
            client_id=self.client_id,
            topics=[self.topic, *([self._retry_topic] if self._retry_topic else [])],
            expiry_ms=max(3 * self._heartbeat_ms, 3_000),
            leaving=leaving,
        )
        try:
            nodes = self._all_nodes()
        except RaftMQError as exc:
            log.warning("consumer.heartbeat_no_route error=%s", exc.message)
            return
        # Every node at once over frames; a dead node, or one without a data address (the
        # consumer cannot pull there either), is skipped: the others carry the membership.
        framed = []
        answers: list[broker_pb2.HeartbeatResponse] = []
        for a in nodes:
            data_address = self.routes.data_address(a)
            if data_address:
                framed.append(self._data.submit(data_address, DataMethod.HEARTBEAT, req, 2.0))
            else:
                log.debug("consumer.heartbeat_skipped node=%s: no data address", a)
        for fut in framed:
            try:
                answer = fut.result(timeout=2 + 1)
            except AccessDeniedError:
                if starting:
                    raise
                continue
            except (RaftMQError, FutureTimeout):
                continue
            assert isinstance(answer, broker_pb2.HeartbeatResponse)
            answers.append(answer)
        if starting and any(a.consume_disabled for a in answers):
            # Fail at start, typed, as for a denied group; a running member keeps going, tells
            # the application once (on_consume_disabled) and its fetchers pull once every few
            # seconds until the group is turned on again (RefusalGate). The nodes
            # took this heartbeat: leave, or the group's members would count this one until it
            # expires and a rebalance would hand it queues nobody reads.
            self._heartbeat(leaving=True)
            raise ConsumeDisabledError.for_group(self.group)
        if not leaving:
            self._follow_resets(answers)
            self._check_membership()

    def _follow_resets(self, answers: Sequence[broker_pb2.HeartbeatResponse]) -> None:
        """Administrative offset resets the brokers announce: each queue this member holds
        restarts at its new offset (RocketMQ's resetOffset pushed to the clients)."""
        moves = self._resets.take(r for a in answers for r in a.resets)
        if answers:
            self._resets.prime()
        for q, offset in sorted(moves.items()):
            self._restart_queue(q, offset)

    def _restart_queue(self, q: QueueRef, offset: int) -> None:
        with self._rebalance_lock:
            if self._closed:
                return
            fetcher = self._fetchers.pop(q, None)
            if fetcher is None:
                return  # not held here: whoever starts it reads the reset committed offset
            fetcher.stop(join=False)
            with self._lock:
                old = self._pqs.pop(q, None)
            if old is not None:
                old.dropped = True  # what its listeners still finish is not committed
            self._start_queue(q, offset)
        log.info("consumer.offset_reset client=%s queue=%s offset=%d", self.client_id, q, offset)
        self._commit_offsets({q: offset})

    def _check_membership(self) -> None:
        """Rebalance at once when the group's members changed (RocketMQ's brokers notify the
        clients; here each member looks at every heartbeat), not only every rebalance period."""
        try:
            members = self._members()
        except RaftMQError as exc:
            log.info("consumer.member_list_failed error=%s", exc.message)
            return
        seen = self._members_seen
        if seen is not None and members != seen:
            log.info("consumer.members_changed client=%s members=%d", self.client_id, len(members))
            self._scheduler.call_later(0, self.rebalance)

    def _members(self) -> list[str]:
        """The union of every broker group's view (each node keeps its own soft state); per
        group the first node that answers, leader first."""
        req = broker_pb2.GetConsumerListRequest(consumer_group=self.group)
        members: set[str] = set()
        route = self.routes.route(self.topic)
        for g in route.groups.values():
            for address in g.addresses:
                try:
                    out = self._pool.broker(address).GetConsumerList(req, timeout=3)
                except grpc.RpcError as exc:
                    log.info(
                        "consumer.member_list_failed node=%s error=%s",
                        address,
                        from_rpc_error(exc).message,
                    )
                    continue
                members.update(out.client_ids)
                break
        members.add(self.client_id)
        return sorted(members)

    def rebalance(self) -> None:
        if self._closed:
            return
        with self._rebalance_lock:
            try:
                queues = self.routes.route(self.topic, refresh=True).read_queues()
                queues += self._retry_queues()
                if self._model is MessageModel.BROADCASTING:
                    mine = queues
                else:
                    members = self._members()
                    mine = allocate(self._allocation, queues, members, self.client_id)
                    self._members_seen = members
            except RaftMQError as exc:
                log.warning("consumer.rebalance_failed error=%s", exc.message)
                return
            plan = plan_rebalance(self._fetchers, mine)
            if not plan.start and not plan.stop:
                return
            self.rebalances += 1
            log.info(
                "consumer.rebalance client=%s start=%d stop=%d keep=%d",
                self.client_id,
                len(plan.start),
                len(plan.stop),
                len(plan.keep),
            )
            for q in plan.stop:
                # No join: a fetcher may sit in a long poll; what it still fetches is dropped.
                self._fetchers.pop(q).stop(join=False)
                with self._lock:
                    pq = self._pqs.pop(q, None)
                if pq is not None:
                    pq.dropped = True
                    self._commit_offsets({q: pq.consumed_offset()})
            for q in plan.start:
                try:
                    start = self._start_offset(q)
                except RaftMQError as exc:
                    log.warning("consumer.start_offset_failed queue=%s error=%s", q, exc.message)
                    continue
                self._start_queue(q, start)

    def _start_queue(self, q: QueueRef, start: int) -> None:
        """A process queue and its fetcher from `start` (the rebalance lock is held)."""
        pq = ProcessQueue(start, self._max_inflight)
        with self._lock:
            self._pqs[q] = pq
        # Bound to this process queue: a fetcher stopped by an earlier rebalance of the
        # same queue may still deliver once, and that must not reach the new one.
        f = QueueFetcher(
            q,
            start,
            self._retry_settings if q.topic == self._retry_topic else self._settings,
            self.routes,
            functools.partial(self._deliver, pq),
            functools.partial(self._reset, pq),
            driver=self._driver,
            has_room=functools.partial(self._has_room, pq),
            data=self._data,
            gate=self._gate,
        )
        self._fetchers[q] = f
        f.start()

    def _retry_queues(self) -> list[QueueRef]:
        """The group's retry topic's queues; none until a first send-back created the topic."""
        if not self._retry_topic:
            return []
        try:
            return self.routes.route(self._retry_topic, refresh=True).read_queues()
        except RaftMQError:
            return []

    def _start_offset(self, q: QueueRef) -> int:
        committed = (
            self._file_offsets.committed(q)
            if self._file_offsets is not None
            else self._broker_offsets.committed(q)
        )
        return self._broker_offsets.start_offset(q, self._start_from, committed)

    def _reset(self, pq: ProcessQueue, q: QueueRef, offset: int) -> int | None:
        new = self._broker_offsets.reset_for(q, offset, self._start_from)
        if new is None:
            return None
        with self._lock:
            pq.reset(new)
        return new

    # ---- consuming ----------------------------------------------------------------------------

    def _has_room(self, pq: ProcessQueue) -> bool:
        # Back-pressure: the fetcher pauses while its queue has too much in listeners.
        with self._lock:
            return pq.has_room() or pq.dropped or self._closed

    def _deliver(self, pq: ProcessQueue, fetched: Fetched) -> None:
        # Never blocks (a fetch driver thread): a queue passes max_inflight_per_queue by at
        # most one pull, since its fetcher asks _has_room before each pull.
        with self._lock:
            if pq.dropped or self._closed:
                return
            pq.add([m.queue_offset for m in fetched.messages], fetched.next_offset)
        for m in fetched.messages:
            try:
                self._executor.submit(self._consume, pq, m, 0)
            except RuntimeError:  # shutting down
                return

    def _consume(self, pq: ProcessQueue, m: ReceivedMessage, attempt: int) -> None:
        if pq.dropped:
            return
        error = "RECONSUME_LATER"
        try:
            result = self._listener(listener_view(m))
        except Exception as exc:
            log.exception("consumer.listener_failed msg_id=%s", m.msg_id)
            result = ConsumeResult.RECONSUME_LATER
            error = f"{type(exc).__name__}: {exc}"
        if result is ConsumeResult.RECONSUME_LATER and self._sent_back(m):
            result = ConsumeResult.SUCCESS  # the broker holds it now: this queue moves on
        if result is ConsumeResult.RECONSUME_LATER:
            if attempt + 1 == self._max_reconsume + 1:
                self._report_stuck(StuckMessage(m, attempt + 1, error))
            # Linear back-off, capped; past the limit the message is retried at the cap for as
            # long as it fails: it is never skipped (in-process for now: no %RETRY% topic yet).
            delay = min(self._reconsume_backoff_s * (attempt + 1), self._max_backoff_s)
            if attempt >= self._max_reconsume:
                delay = self._max_backoff_s
            self._scheduler.call_later(delay, lambda: self._resubmit(pq, m, attempt + 1))
            return
        if self._stuck.pop(m.msg_id, None) is not None:
            log.warning("consumer.unstuck msg_id=%s attempts=%d", m.msg_id, attempt + 1)
        with self._lock:
            pq.done(m.queue_offset)
            self._lock.notify_all()
            f = self._fetchers.get(QueueRef(m.topic, m.broker_group, m.queue_id))
            wake = f is not None and pq.has_room()
        if wake and f is not None:
            f.wake()

    def _sent_back(self, m: ReceivedMessage) -> bool:
        """Clustering: hand a failed message to the broker (retry topic with its back-off, or
        the dead-letter topic past the limit). False (keep it, retry locally) if that failed."""
        if not self._retry_topic or self._closed:
            return False
        try:
            back = self._send_back.send(m, self._max_reconsume, self._retry_delay_level)
        except RaftMQError as exc:
            log.warning("consumer.send_back_failed msg_id=%s error=%s", m.msg_id, exc.message)
            return False
        if back.dead_letter:
            log.warning(
                "consumer.dead_letter msg_id=%s topic=%s new_id=%s reconsume_times=%d",
                m.msg_id,
                back.topic,
                back.msg_id,
                back.reconsume_times,
            )
        elif not any(q.topic == back.topic for q in list(self._fetchers)):
            # The first send-back created the retry topic: read it without waiting a period
            # (twice: the NameServer learns of the topic from the broker's next registration).
            self._scheduler.call_later(0.2, self.rebalance)
            self._scheduler.call_later(1.5, self.rebalance)
        return True

    def _report_stuck(self, stuck: StuckMessage) -> None:
        m = stuck.message
        self._stuck[m.msg_id] = stuck
        log.warning(
            "consumer.retry_limit_reached msg_id=%s queue=%s offset=%d attempts=%d error=%s: "
            "the message is kept and retried every %.1f s; its queue's committed offset stays "
            "before it until the listener succeeds",
            m.msg_id,
            QueueRef(m.topic, m.broker_group, m.queue_id),
            m.queue_offset,
            stuck.attempts,
            stuck.error,
            self._max_backoff_s,
        )
        if self._on_stuck is not None:
            try:
                self._on_stuck(stuck)
            except Exception:
                log.exception("consumer.on_stuck_failed msg_id=%s", m.msg_id)

    def _tell_disabled(self, error: ConsumeDisabledError) -> None:
        callback = self._on_consume_disabled
        if callback is None:
            return

        def call() -> None:
            try:
                callback(error)
            except Exception:
                log.exception("consumer.on_consume_disabled_failed group=%s", self.group)

        # On a consume thread, where the application's code runs: never on the fetch threads.
        with contextlib.suppress(RuntimeError):  # closing
            self._executor.submit(call)

    @property
    def consume_disabled(self) -> ConsumeDisabledError | None:
        """Why the group's pulls are refused now (its config turns consuming off), or None
        while it consumes."""
        return self._gate.state.error

    def stuck(self) -> list[StuckMessage]:
        """Messages past max_reconsume_times that the listener still fails: kept, not skipped."""
        return list(self._stuck.values())

    def _resubmit(self, pq: ProcessQueue, m: ReceivedMessage, attempt: int) -> None:
        # Closing: the offset stays uncommitted and the message comes again.
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._consume, pq, m, attempt)

    def commit(self) -> None:
        """Commit the queues whose consumed offset moved since this member last committed it
        (issue 14: an idle member committing every second cost the broker a request and a log
        entry a second for nothing)."""
        with self._lock:
            offsets = {
                q: off
                for q, pq in self._pqs.items()
                if self._committed.get(q) != (off := pq.consumed_offset())
            }
            for q in [q for q in self._committed if q not in self._pqs]:
                del self._committed[q]  # not held here now: whoever holds it commits it
        if offsets:
            self._commit_offsets(offsets)

    def _commit_offsets(self, offsets: dict[QueueRef, int]) -> None:
        try:
            if self._file_offsets is not None:
                self._file_offsets.commit(offsets)
            else:
                self._broker_offsets.commit(offsets)
        except RaftMQError as exc:
            log.warning("consumer.commit_failed error=%s", exc.message)
            return
        with self._lock:
            self._committed.update(offsets)


def wait_idle(consumer: PushConsumer, timeout_s: float) -> bool:
    """Test and tool helper: True once no message is in a listener or waiting for one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with consumer._lock:
            if all(pq.inflight_count == 0 for pq in consumer._pqs.values()):
                return True
        time.sleep(0.02)
    return False
