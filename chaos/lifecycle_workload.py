"""The lifecycle workloads of the chaos suite (issue 16), run like chaos/workload.py (`--mode`):
each exercises one feature while the nemesis kills leaders, and records what
chaos/lifecycle_checks.py needs.

- `txn`: a TransactionProducer sends transactions whose outcome is fixed by their sequence
  number (commit, rollback, UNKNOWN then commit at check-back, UNKNOWN then rollback at
  check-back); its checker answers check-backs from the id in the body. A pull consumer records
  what becomes visible.
- `delay`: sends with a delay of 0.5-8 s (seeded by the sequence), so messages fall due all
  through a leader kill; a pull consumer records deliveries with their queue positions.
- `retry`: plain sends; a push consumer whose listener returns RECONSUME_LATER for the first
  RETRY_FAILURES attempts of every message, so send-backs and retries run through the kill.
- `orderly`: the ordered producers of the queue workload and an orderly push consumer whose
  listener records when each call started and ended.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable

from raftmq.chaos.history import Recorder
from raftmq.chaos.workload import (
    Workload,
    WorkloadSettings,
    _logged,
    body_of,
    classify,
    parse_body,
)
from raftmq.client.consumer_orderly import OrderlyPushConsumer
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.producer.transaction import (
    HalfMessage,
    LocalTransactionState,
    TransactionCheck,
    TransactionProducer,
)
from raftmq.common.errors import RaftMQError

INTENTS = ("commit", "rollback", "check-commit", "check-rollback")
DELAY_MIN_MS = 500
DELAY_MAX_MS = 8_000
RETRY_FAILURES = 2  # the listener fails attempts 0 and 1 of every message, succeeds at 2
LIFECYCLE_RATE_PER_S = 10.0  # modest: six server processes share two cores with the workload
TXN_LINGER_S = 15.0  # < the drain's producer join (send timeout + 10 s)
ORDERLY_CALL_S = 0.002  # an orderly listener call lasts this long (overlaps become visible)


def intent_of(seq: int) -> str:
    return INTENTS[seq % len(INTENTS)]


def delay_of(seq: int) -> int:
    return random.Random(seq).randint(DELAY_MIN_MS, DELAY_MAX_MS)


class LifecycleWorkload(Workload):
    def __init__(self, settings: WorkloadSettings, recorder: Recorder, mode: str) -> None:
        super().__init__(settings, recorder)
        self.mode = mode
        self._period = 1.0 / LIFECYCLE_RATE_PER_S

    def _paced(self, body: Callable[[int], None]) -> None:
        seq = 0
        next_at = time.monotonic()
        while not self.stop_sending.is_set():
            body(seq)
            seq += 1
            next_at = max(next_at + self._period, time.monotonic() - self._period)
            self.stop_sending.wait(max(0.0, next_at - time.monotonic()))

    # ---- txn ----------------------------------------------------------------------------------

    def _txn_check(self, check: TransactionCheck) -> LocalTransactionState:
        msg_id, _ = parse_body(check.message.body)
        seq = int(msg_id.rsplit("-", 1)[1])
        intent = intent_of(seq)
        answer = (
            LocalTransactionState.COMMIT
            if intent in ("commit", "check-commit")
            else LocalTransactionState.ROLLBACK
        )
        self.rec.record(
            "txn-checker",
            "info",
            "event",
            {"kind": "check", "id": msg_id, "answer": answer.value, "times": check.check_times},
        )
        return answer

    def _txn(self) -> None:
        name = "producer-txn"
        with TransactionProducer(
            self.s.namesrv,
            "chaos-txn",
            self._txn_check,
            request_timeout_ms=self.s.request_timeout_ms,
            send_timeout_ms=self.s.send_timeout_ms,
            end_timeout_ms=self.s.send_timeout_ms,
        ) as p:

            def one(seq: int) -> None:
                msg_id, intent = f"txn-{seq}", intent_of(seq)
                self.rec.record(
                    name, "invoke", "send", {"id": msg_id, "key": None, "intent": intent}
                )
                local = {
                    "commit": LocalTransactionState.COMMIT,
                    "rollback": LocalTransactionState.ROLLBACK,
                }.get(intent, LocalTransactionState.UNKNOWN)

                def run_local(half: HalfMessage) -> LocalTransactionState:
                    return local

                try:
                    r = p.send_in_transaction(self.s.topic, body_of(msg_id, None), run_local)
                except RaftMQError as exc:
                    value = {"id": msg_id, "key": None, "intent": intent, "half": False}
                    self.rec.record(name, classify(exc), "send", {**value, "error": exc.code})
                    return
                # The half is stored: a commit intent is a promise (the end or a check-back
                # commits it), a rollback intent must never become visible.
                value = {"id": msg_id, "key": None, "intent": intent, "half": True}
                end_error = r.end_error()  # the end is sent without waiting: wait here
                if end_error is not None:
                    value["end_error"] = end_error.code
                if intent in ("commit", "check-commit"):
                    self.rec.record(name, "ok", "send", value)
                    self._acknowledged(msg_id)
                else:
                    self.rec.record(name, "fail", "send", value)

            self._paced(one)
            # The last transactions are committed by check-backs, which need a live member of
            # the producer group: stay until the consumer saw every promised one (bounded).
            deadline = time.monotonic() + TXN_LINGER_S
            while time.monotonic() < deadline:
                with self._lock:
                    if self._acked <= self._seen:
                        break
                time.sleep(0.1)

    # ---- delay --------------------------------------------------------------------------------

    def _delay(self) -> None:
        name = "producer-delay"
        with self._producer(name) as p:

            def one(seq: int) -> None:
                msg_id, delay = f"{name}-{seq}", delay_of(seq)
                value = {"id": msg_id, "key": None, "delay_ms": delay}
                self.rec.record(name, "invoke", "send", value)
                try:
                    p.send(self.s.topic, body_of(msg_id, None), delay_ms=delay)
                except RaftMQError as exc:
                    self.rec.record(name, classify(exc), "send", {**value, "error": exc.code})
                else:
                    self.rec.record(name, "ok", "send", value)  # delayed: no offset yet
                    self._acknowledged(msg_id)

            self._paced(one)

    # ---- retry and plain sends ----------------------------------------------------------------

    def _plain(self) -> None:
        name = "producer-0"
        with self._producer(name) as p:

            def one(seq: int) -> None:
                msg_id = f"{name}-{seq}"
                self.rec.record(name, "invoke", "send", {"id": msg_id, "key": None})
                try:
                    p.send(self.s.topic, body_of(msg_id, None))
                except RaftMQError as exc:
                    self.rec.record(
                        name, classify(exc), "send", {"id": msg_id, "key": None, "error": exc.code}
                    )
                else:
                    self.rec.record(name, "ok", "send", {"id": msg_id, "key": None})
                    self._acknowledged(msg_id)

            self._paced(one)

    def _retry_listener(self, m: ReceivedMessage) -> ConsumeResult:
        msg_id, _ = parse_body(m.body)
        n = m.reconsume_times
        fail = n < RETRY_FAILURES
        self.rec.record(
            "consumer-retry",
            "ok",
            "recv",
            {"id": msg_id, "key": None, "reconsume": n, "result": "later" if fail else "ok"},
        )
        if fail:
            return ConsumeResult.RECONSUME_LATER
        self._delivered(msg_id)
        return ConsumeResult.SUCCESS

    def _delivered(self, msg_id: str) -> None:
        with self._lock:
            self._seen.add(msg_id)
            self._last_delivery = time.monotonic()

    def _orderly_listener(self, m: ReceivedMessage) -> ConsumeResult:
        start = time.monotonic()
        time.sleep(ORDERLY_CALL_S)
        msg_id, key = parse_body(m.body)
        self.rec.record(
            "consumer-orderly",
            "ok",
            "recv",
            {
                "id": msg_id,
                "key": key,
                "queue": f"{m.broker_group}:{m.queue_id}",
                "offset": m.queue_offset,
                "start": start,
                "end": time.monotonic(),
            },
        )
        self._delivered(msg_id)
        return ConsumeResult.SUCCESS

    def _push(self, make: Callable[[], PushConsumer]) -> None:
        c = make().start()
        try:
            self.stop_consuming.wait()
        finally:
            c.close()

    def _retry_consumer(self) -> None:
        self._push(
            lambda: PushConsumer(
                self.s.namesrv,
                "chaos-retry",
                self.s.topic,
                self._retry_listener,
                start_from=StartFrom.EARLIEST,
                consume_threads=4,
                rebalance_interval_ms=2_000,
                heartbeat_interval_ms=1_000,
            )
        )

    def _orderly_consumer(self) -> None:
        self._push(
            lambda: OrderlyPushConsumer(
                self.s.namesrv,
                "chaos-orderly",
                self.s.topic,
                self._orderly_listener,
                start_from=StartFrom.EARLIEST,
                consume_threads=4,
                rebalance_interval_ms=2_000,
                heartbeat_interval_ms=1_000,
            )
        )

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """The consumer first: Workload.drain joins threads[1:] as producers, threads[0] last."""
        targets: list[Callable[[], None]]
        if self.mode == "txn":
            targets = [self._consume, self._txn]
        elif self.mode == "delay":
            targets = [self._consume, self._delay]
        elif self.mode == "retry":
            targets = [self._retry_consumer, self._plain]
        elif self.mode == "orderly":
            targets = [self._orderly_consumer] + [
                functools.partial(self._ordered, i) for i in range(self.s.ordered_producers)
            ]
        else:
            raise ValueError(f"no lifecycle workload {self.mode!r}")
        for t in targets:
            th = threading.Thread(target=_logged(t), daemon=True)
            th.start()
            self._threads.append(th)
