"""OrderlyPushConsumer: RocketMQ's MessageListenerOrderly. Each queue's messages go to the listener
one at a time, in queue order, only while this client holds the queue's lock on the broker.

The decisions are client/orderly.py's OrderlyProcessQueue (one at a time, suspend and retry the
same message, dead-letter after max_reconsume_times, never skip) and broker/locks.py's replicated
lock table; this module is the shell around them:
- a queue assigned by the rebalance is started only once its lock is granted (a queue another
  member still holds is retried every `lock_retry_ms`), from the offset committed by its last
  owner, read after the grant;
- held locks are renewed every `lock_renew_interval_ms` (20 s); the client trusts a grant for
  `lock_live_ms` (30 s), half the broker's lease, so it stops before another member could start;
- a queue given up by a rebalance (or close) stops handing out messages, waits for the message in
  the listener, commits the offset of the next one and only then unlocks;
- a message that fails `max_reconsume_times` times is moved to `%DLQ%<group>` by the broker's
  send-back, as a push consumer's (client/retry_back.py), and only after that succeeds does its
  queue move on.
Membership, heartbeats, routes, fetchers and offsets are PushConsumer's.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import grpc

from raftmq.client.consumer_push import ConsumeResult, Listener, MessageModel, PushConsumer
from raftmq.client.fetcher import Fetched, QueueFetcher
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.orderly import (
    DEFAULT_CLIENT_LOCK_LIVE_MS,
    DEFAULT_LOCK_RENEW_INTERVAL_MS,
    DEFAULT_SUSPEND_MS,
    OrderlyProcessQueue,
    Verdict,
)
from raftmq.client.rebalance import AllocationStrategy, allocate, plan_rebalance
from raftmq.common.errors import InvalidArgumentError, RaftMQError, from_rpc_error
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef

log = logging.getLogger("raftmq.consumer.orderly")

LOCK_RPC_TIMEOUT_S = 5.0
DEFAULT_LOCK_RETRY_MS = 1_000  # a queue whose lock another member holds is asked for again
CLOSE_WAIT_S = 30.0  # close() waits this long for listeners in flight before leaving anyway


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that failed max_reconsume_times + 1 times and was sent to %DLQ%<group>."""

    message: ReceivedMessage
    attempts: int
    dlq_msg_id: str


DeadLetterCallback = Callable[[DeadLetter], None]


@dataclass(eq=False)
class _Queue:
    """One held queue: its process queue, its fetcher, whether a task of it is in a listener."""

    queue: QueueRef
    pq: OrderlyProcessQueue[ReceivedMessage]
    fetcher: QueueFetcher | None = None
    running: bool = False
    released: bool = False
    timer_set: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class OrderlyPushConsumer(PushConsumer):
    """A clustering PushConsumer whose listener sees each queue's messages one at a time, in
    order. The listener returns SUCCESS, or RECONSUME_LATER (or raises) to suspend the queue for
    `suspend_ms` and get the same message again."""

    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        group: str,
        topic: str,
        listener: Listener,
        *,
        tag_expression: str = "*",
        sql_expression: str = "",
        allocation: AllocationStrategy = AllocationStrategy.AVERAGELY,
        start_from: StartFrom = StartFrom.LATEST,
        consume_threads: int = 8,
        max_buffered_per_queue: int = 1_000,
        rebalance_interval_ms: int = 20_000,
        heartbeat_interval_ms: int = 10_000,
        commit_interval_ms: int = 1_000,
        max_reconsume_times: int = 16,
        suspend_ms: int = DEFAULT_SUSPEND_MS,
        lock_renew_interval_ms: int = DEFAULT_LOCK_RENEW_INTERVAL_MS,
        lock_live_ms: int = DEFAULT_CLIENT_LOCK_LIVE_MS,
        lock_retry_ms: int = DEFAULT_LOCK_RETRY_MS,
        long_poll_ms: int = 2_000,
        client_id: str | None = None,
        on_dead_letter: DeadLetterCallback | None = None,
        trace: bool = False,
    ) -> None:
        super().__init__(
            namesrv_addresses,
            group,
            topic,
            listener,
            tag_expression=tag_expression,
            sql_expression=sql_expression,
            message_model=MessageModel.CLUSTERING,
            allocation=allocation,
            start_from=start_from,
            consume_threads=consume_threads,
            max_inflight_per_queue=max_buffered_per_queue,
            rebalance_interval_ms=rebalance_interval_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            commit_interval_ms=commit_interval_ms,
            max_reconsume_times=max_reconsume_times,
            long_poll_ms=long_poll_ms,
            client_id=client_id,
            trace=trace,
        )
        if suspend_ms < 0 or min(lock_renew_interval_ms, lock_live_ms, lock_retry_ms) < 1:
            raise InvalidArgumentError(
                "suspend_ms must be >= 0; lock_renew_interval_ms, lock_live_ms and "
                "lock_retry_ms >= 1"
            )
        if lock_renew_interval_ms >= lock_live_ms:
            raise InvalidArgumentError(
                f"lock_renew_interval_ms ({lock_renew_interval_ms}) must be below lock_live_ms "
                f"({lock_live_ms}), or a held lock lapses between renewals"
            )
        self._suspend_ms = suspend_ms
        self._renew_ms = lock_renew_interval_ms
        self._lock_live_ms = lock_live_ms
        self._lock_retry_s = lock_retry_ms / 1000
        self._max_buffered = max_buffered_per_queue
        self._on_dead_letter = on_dead_letter
        self._oqs: dict[QueueRef, _Queue] = {}
        self._waiting: set[QueueRef] = set()  # assigned, lock not granted yet
        self._stopping = False  # close() began: no rebalance or lock round starts any more
        self.dead_letters = 0
        self.lock_refusals = 0

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> OrderlyPushConsumer:
        if self._started:
            return self
        super().start()
        if not self._closed:
            self._scheduler.every(self._lock_retry_s, self._lock_tick)
        return self

    def close(self) -> None:
        """Stop handing out messages, let the ones in listeners finish, commit, unlock, leave."""
        if self._closed or self._stopping:
            return
        self._stopping = True
        with self._rebalance_lock:
            held = list(self._oqs.values())
            self._oqs.clear()
            self._waiting.clear()
        for oq in held:
            self._release(oq)  # a queue with a message in a listener is released by its task
        deadline = time.monotonic() + CLOSE_WAIT_S
        while time.monotonic() < deadline and not all(oq.released for oq in held):
            time.sleep(0.02)
        super().close()

    def assignment(self) -> list[QueueRef]:
        """The queues this member holds (locked and consuming)."""
        return sorted(self._oqs)

    def waiting_for_lock(self) -> list[QueueRef]:
        return sorted(self._waiting)

    # ---- rebalance and locks ------------------------------------------------------------------

    def rebalance(self) -> None:
        if self._closed or self._stopping:
            return
        with self._rebalance_lock:
            try:
                queues = self.routes.route(self.topic, refresh=True).read_queues()
                members = self._members()
                mine = allocate(self._allocation, queues, members, self.client_id)
                self._members_seen = members
            except RaftMQError as exc:
                log.warning("consumer.rebalance_failed error=%s", exc.message)
                return
            plan = plan_rebalance(set(self._oqs) | self._waiting, mine)
            if plan.changed:
                self.rebalances += 1
                log.info(
                    "consumer.orderly_rebalance client=%s start=%d stop=%d keep=%d",
                    self.client_id,
                    len(plan.start),
                    len(plan.stop),
                    len(plan.keep),
                )
            for q in plan.stop:
                self._waiting.discard(q)
                oq = self._oqs.pop(q, None)
                if oq is not None:
                    self._release(oq)
            self._waiting.update(plan.start)
            self._lock_waiting()

    def _lock_tick(self) -> None:
        """Renew held locks that are due, ask again for the queues still waiting."""
        if self._closed or self._stopping:
            return
        with self._rebalance_lock:
            now = _now_ms()
            due = [q for q, oq in self._oqs.items() if oq.pq.lock_renew_due(now, self._renew_ms)]
            for group_queues in _by_group(due).values():
                granted, refused = self._lock_rpc("LockQueues", group_queues)
                if granted is None:
                    continue  # the broker did not answer: the client's view lapses by itself
                at = _now_ms()
                for q in group_queues:
                    oq = self._oqs.get(q)
                    if oq is None:
                        continue
                    if q in granted:
                        with self._lock:
                            oq.pq.lock_granted(at)
                        self._dispatch(oq)
                    elif q in refused:
                        log.warning(
                            "consumer.orderly_lock_lost client=%s queue=%s: another member holds "
                            "it; consuming stops until it is granted again",
                            self.client_id,
                            q,
                        )
                        with self._lock:
                            oq.pq.lock_lost()
            self._lock_waiting()

    def _lock_waiting(self) -> None:
        """Lock the queues waiting for it; start each one granted (caller holds the rebalance
        lock)."""
        for group_queues in _by_group(sorted(self._waiting)).values():
            granted, _ = self._lock_rpc("LockQueues", group_queues)
            if granted is None:
                continue
            at = _now_ms()
            for q in group_queues:
                if q not in granted:
                    self.lock_refusals += 1
                    continue
                try:
                    start = self._start_offset(q)  # after the grant: the last owner committed
                except RaftMQError as exc:
                    log.warning("consumer.start_offset_failed queue=%s error=%s", q, exc.message)
                    continue  # still locked by us; asked again (and renewed) next tick
                self._waiting.discard(q)
                self._start_orderly_queue(q, start, at)

    def _start_orderly_queue(self, q: QueueRef, start: int, granted_ms: int) -> None:
        pq: OrderlyProcessQueue[ReceivedMessage] = OrderlyProcessQueue(
            start,
            max_buffered=self._max_buffered,
            max_reconsume_times=self._max_reconsume,
            suspend_ms=self._suspend_ms,
            lock_live_ms=self._lock_live_ms,
        )
        pq.lock_granted(granted_ms)
        oq = _Queue(q, pq)
        oq.fetcher = QueueFetcher(
            q,
            start,
            self._settings,
            self.routes,
            functools.partial(self._deliver_orderly, oq),
            functools.partial(self._reset_orderly, oq),
            driver=self._driver,
            has_room=functools.partial(self._has_room_orderly, oq),
            data=self._data,
        )
        self._oqs[q] = oq
        log.info("consumer.orderly_queue_started client=%s queue=%s offset=%d", self.client_id,
                 q, start)  # fmt: skip
        oq.fetcher.start()

    def _release(self, oq: _Queue) -> None:
        """Give a queue up: no more messages handed out; commit and unlock once the message in
        the listener (if any) has returned."""
        if oq.fetcher is not None:
            oq.fetcher.stop(join=False)
        with self._lock:
            oq.pq.drop()
            busy = oq.running
        if not busy:
            self._finish_release(oq)

    def _finish_release(self, oq: _Queue) -> None:
        with oq.lock:
            if oq.released:
                return
            oq.released = True
        with self._lock:
            offset = oq.pq.consumed_offset()
        try:
            self._broker_offsets.commit({oq.queue: offset})
        except RaftMQError as exc:
            # Not unlocked either: the next owner waits for the lease to expire, then starts
            # from the last committed offset (it may see messages again, never skip one).
            log.warning("consumer.orderly_release_commit_failed queue=%s error=%s", oq.queue,
                        exc.message)  # fmt: skip
            return
        granted, _ = self._lock_rpc("UnlockQueues", [oq.queue])
        log.info("consumer.orderly_queue_released client=%s queue=%s offset=%d unlocked=%s",
                 self.client_id, oq.queue, offset, granted is not None)  # fmt: skip

    def _lock_rpc(
        self, method: str, queues: Sequence[QueueRef]
    ) -> tuple[frozenset[QueueRef] | None, frozenset[QueueRef]]:
        """Lock or unlock queues of one broker group at its leader: (granted, refused), or
        (None, {}) when no leader answered (after one retry with a fresh route)."""
        first = queues[0]
        req = broker_pb2.LockQueuesRequest(
            consumer_group=self.group,
            client_id=self.client_id,
            topic=first.topic,
            queue_ids=[q.queue_id for q in queues],
        )
        for attempt in range(2):
            try:
                address = self.routes.leader(first.topic, first.broker_group, refresh=attempt > 0)
                resp = getattr(self._pool.broker(address), method)(req, timeout=LOCK_RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                log.info("consumer.orderly_lock_failed method=%s group=%s error=%s", method,
                         first.broker_group, err.message)  # fmt: skip
                if not err.retryable:
                    break
                continue
            except RaftMQError as exc:
                log.info("consumer.orderly_lock_failed method=%s group=%s error=%s", method,
                         first.broker_group, exc.message)  # fmt: skip
                continue
            by_id = {q.queue_id: q for q in queues}
            granted = frozenset(by_id[i] for i in resp.granted if i in by_id)
            refused = frozenset(by_id[i] for i in resp.refused if i in by_id)
            return granted, refused
        return None, frozenset()

    # ---- consuming ----------------------------------------------------------------------------

    def _has_room_orderly(self, oq: _Queue) -> bool:
        with self._lock:
            return oq.pq.has_room() or oq.pq.dropped or self._closed

    def _reset_orderly(self, oq: _Queue, q: QueueRef, offset: int) -> int | None:
        # The queue's data moved under us (deleted or reset): go on where the policy says; the
        # messages buffered stay in order ahead of it.
        return self._broker_offsets.reset_for(q, offset, self._start_from)

    def _deliver_orderly(self, oq: _Queue, fetched: Fetched) -> None:
        with self._lock:
            if oq.pq.dropped or self._closed:
                return
            try:
                oq.pq.add([(m.queue_offset, m) for m in fetched.messages], fetched.next_offset)
            except ValueError as exc:  # a fetch that went backwards (a reset): never reorder
                log.warning("consumer.orderly_fetch_ignored queue=%s error=%s", oq.queue, exc)
                return
        self._dispatch(oq)

    def _dispatch(self, oq: _Queue) -> None:
        """Hand the queue's head message to a listener thread, if nothing of the queue is in one
        and it may go now; otherwise arm a timer for the end of a suspension."""
        with self._lock:
            if oq.running or self._closed:
                return
            now = _now_ms()
            item = oq.pq.take(now)
            if item is None:
                wake = oq.pq.wake_at_ms()
                if len(oq.pq) and wake > now and not oq.timer_set and not oq.pq.dropped:
                    oq.timer_set = True
                    self._scheduler.call_later((wake - now) / 1000, lambda: self._wake(oq))
                return
            oq.running = True
        offset, message = item
        try:
            self._executor.submit(self._run, oq, offset, message)
        except RuntimeError:  # shutting down: the offset stays before this message
            with self._lock:
                oq.running = False

    def _wake(self, oq: _Queue) -> None:
        with self._lock:
            oq.timer_set = False
        self._dispatch(oq)

    def _run(self, oq: _Queue, offset: int, m: ReceivedMessage) -> None:
        pq = oq.pq
        with self._lock:
            attempts = pq.attempts()
        delivered = m.replace(reconsume_times=attempts) if attempts else m
        ok = False
        try:
            ok = self._listener(delivered) is not ConsumeResult.RECONSUME_LATER
        except Exception:
            log.exception("consumer.listener_failed msg_id=%s", m.msg_id)
        with self._lock:
            step = pq.succeeded(offset) if ok else pq.failed(offset, _now_ms())
        if step.verdict is Verdict.RETRY:
            log.info("consumer.orderly_suspended queue=%s offset=%d attempts=%d", oq.queue, offset,
                     step.attempts)  # fmt: skip
        elif step.verdict is Verdict.DEAD_LETTER:
            dlq_id = self._dead_letter(m, step.attempts)
            with self._lock:
                if dlq_id is not None:
                    pq.dead_lettered(offset)
                else:
                    pq.dead_letter_failed(offset, _now_ms())
            if dlq_id is not None and self._on_dead_letter is not None:
                try:
                    self._on_dead_letter(DeadLetter(m, step.attempts, dlq_id))
                except Exception:
                    log.exception("consumer.on_dead_letter_failed msg_id=%s", m.msg_id)
        with self._lock:
            oq.running = False
            dropped = pq.dropped
            room = pq.has_room()
        if dropped:
            self._finish_release(oq)
            return
        if room and oq.fetcher is not None:
            oq.fetcher.wake()
        self._dispatch(oq)

    def _dead_letter(self, m: ReceivedMessage, attempts: int) -> str | None:
        """Have the broker move `m` to %DLQ%<group> (the push consumer's send-back, with the
        local failures as the count, so the copy says what a push consumer's does); its id, or
        None if that failed (the queue is then suspended and the message retried, never
        skipped)."""
        try:
            # The count it carried when delivered: the failures before this last one.
            back = self._send_back.send(m, self._max_reconsume, reconsume_times=attempts - 1)
        except RaftMQError as exc:
            log.warning("consumer.orderly_dead_letter_failed msg_id=%s error=%s", m.msg_id,
                        exc.message)  # fmt: skip
            return None
        self.dead_letters += 1
        log.warning(
            "consumer.orderly_dead_lettered msg_id=%s queue=%s offset=%d attempts=%d dlq=%s "
            "dlq_msg_id=%s",
            m.msg_id,
            QueueRef(m.topic, m.broker_group, m.queue_id),
            m.queue_offset,
            attempts,
            back.topic,
            back.msg_id,
        )
        return back.msg_id

    # ---- offsets ------------------------------------------------------------------------------

    def commit(self) -> None:
        with self._rebalance_lock:
            with self._lock:
                offsets = {q: oq.pq.consumed_offset() for q, oq in self._oqs.items()}
            if offsets:
                self._commit_offsets(offsets)


def _by_group(queues: Iterable[QueueRef]) -> dict[tuple[str, str], list[QueueRef]]:
    out: dict[tuple[str, str], list[QueueRef]] = {}
    for q in queues:
        out.setdefault((q.topic, q.broker_group), []).append(q)
    return out
