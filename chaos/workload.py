"""The chaos workload: producers and a consumer that record every invoke/ok/fail/info in a
history, run in the client network namespace (`python -m chaos.workload ...`). The harness
tells it to drain through stdin ("drain\\n"); it then stops sending, consumes until every
acknowledged message was seen (or nothing new came for `idle_s`, or the drain deadline), writes
the history and exits. Outcomes follow the SDK's contract: OutcomeUnknownError (or anything
that is not a raftmq error) is `info`; every other raftmq error means "not stored" and is a
definite `fail`, which the lost/duplicate checker holds it to (fail_delivered)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from raftmq.chaos.history import OpType, Recorder
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import OutcomeUnknownError, RaftMQError
from raftmq.common.log_text import configure_logging

log = logging.getLogger("raftmq.chaos.workload")
CONSUMER_GROUP = "chaos-checker"  # a secure run's user may consume in this group only


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    namesrv: str
    topic: str
    ordered_producers: int = 2
    keys_per_producer: int = 2
    ordered_rate_per_s: float = 20.0  # per ordered producer (sequential sends)
    unordered_rate_per_s: float = 20.0  # async sends without a key
    request_timeout_ms: int = 1_000
    send_timeout_ms: int = 10_000
    drain_idle_s: float = 5.0
    drain_deadline_s: float = 30.0


def body_of(msg_id: str, key: str | None) -> bytes:
    return f"{msg_id}|{key or ''}".encode()


def parse_body(body: bytes) -> tuple[str, str | None]:
    text = body.decode("utf-8", errors="replace")
    msg_id, _, key = text.partition("|")
    return msg_id, key or None


def classify(exc: BaseException) -> OpType:
    if isinstance(exc, RaftMQError) and not isinstance(exc, OutcomeUnknownError):
        return "fail"  # the producer says "not stored" (see client.producer.retry.final_error)
    return "info"


def _ok_value(msg_id: str, key: str | None, r: SendResult) -> dict[str, object]:
    value: dict[str, object] = {"id": msg_id, "key": key}
    if r.queue_offset >= 0:  # -1: the broker did not say (debug ack-before-commit)
        value["queue"] = f"{r.broker_group}:{r.queue_id}"
        value["offset"] = r.queue_offset
    return value


class Workload:
    def __init__(self, settings: WorkloadSettings, recorder: Recorder) -> None:
        self.s = settings
        self.rec = recorder
        self.stop_sending = threading.Event()
        self.stop_consuming = threading.Event()
        self._acked: set[str] = set()
        self._seen: set[str] = set()
        self._last_delivery = time.monotonic()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._outstanding: set[Future[SendResult]] = set()

    def _producer(self, name: str) -> Producer:
        return Producer(
            self.s.namesrv,
            producer_id=f"chaos-{name}-{int(time.time() * 1000)}",
            request_timeout_ms=self.s.request_timeout_ms,
            send_timeout_ms=self.s.send_timeout_ms,
        )

    def _acknowledged(self, msg_id: str) -> None:
        with self._lock:
            self._acked.add(msg_id)

    # ---- producers ----------------------------------------------------------------------------

    def _ordered(self, index: int) -> None:
        """Sequential sync sends, round robin over this producer's keys: each send is invoked
        only after the previous one completed, which is what makes their order required."""
        name = f"producer-{index}"
        keys = [f"k{index}-{j}" for j in range(self.s.keys_per_producer)]
        period = 1.0 / self.s.ordered_rate_per_s
        with self._producer(name) as p:
            seq = 0
            next_at = time.monotonic()
            while not self.stop_sending.is_set():
                key = keys[seq % len(keys)]
                msg_id = f"{name}-{seq}"
                seq += 1
                self.rec.record(name, "invoke", "send", {"id": msg_id, "key": key})
                try:
                    r = p.send(self.s.topic, body_of(msg_id, key), sharding_key=key)
                except RaftMQError as exc:
                    self.rec.record(
                        name, classify(exc), "send", {"id": msg_id, "key": key, "error": exc.code}
                    )
                else:
                    self.rec.record(name, "ok", "send", _ok_value(msg_id, key, r))
                    self._acknowledged(msg_id)
                next_at = max(next_at + period, time.monotonic() - period)
                self.stop_sending.wait(max(0.0, next_at - time.monotonic()))

    def _unordered(self) -> None:
        """Async sends at a steady rate, many in flight: their order is not constrained."""
        name = "producer-u"
        period = 1.0 / self.s.unordered_rate_per_s
        with self._producer(name) as p:
            seq = 0
            next_at = time.monotonic()
            while not self.stop_sending.is_set():
                msg_id = f"{name}-{seq}"
                seq += 1
                self.rec.record(name, "invoke", "send", {"id": msg_id, "key": None})
                try:
                    fut = p.send_async(self.s.topic, body_of(msg_id, None))
                except RaftMQError as exc:
                    self.rec.record(
                        name, classify(exc), "send", {"id": msg_id, "key": None, "error": exc.code}
                    )
                else:
                    with self._lock:
                        self._outstanding.add(fut)
                    fut.add_done_callback(partial(self._async_done, name, msg_id))
                next_at = max(next_at + period, time.monotonic() - period)
                self.stop_sending.wait(max(0.0, next_at - time.monotonic()))
            # Every invoke gets its completion before the history is written.
            p.flush(self.s.send_timeout_ms / 1000 + 5)

    def _async_done(self, name: str, msg_id: str, fut: Future[SendResult]) -> None:
        with self._lock:
            self._outstanding.discard(fut)
        exc = fut.exception()
        if exc is None:
            self.rec.record(name, "ok", "send", _ok_value(msg_id, None, fut.result()))
            self._acknowledged(msg_id)
        else:
            code = exc.code if isinstance(exc, RaftMQError) else type(exc).__name__
            self.rec.record(name, classify(exc), "send", {"id": msg_id, "key": None, "error": code})

    # ---- consumer -----------------------------------------------------------------------------

    def _consume(self) -> None:
        name = "consumer-0"
        with PullConsumer(self.s.namesrv, CONSUMER_GROUP, start_from=StartFrom.EARLIEST) as c:
            c.subscribe(self.s.topic)
            last_commit = time.monotonic()
            while not self.stop_consuming.is_set():
                batch = c.poll(200)
                for m in batch:
                    msg_id, key = parse_body(m.body)
                    self.rec.record(
                        name,
                        "ok",
                        "recv",
                        {
                            "id": msg_id,
                            "key": key,
                            "queue": f"{m.broker_group}:{m.queue_id}",
                            "offset": m.queue_offset,
                        },
                    )
                    with self._lock:
                        self._seen.add(msg_id)
                        self._last_delivery = time.monotonic()
                if time.monotonic() - last_commit > 1.0:
                    c.commit_async()
                    last_commit = time.monotonic()

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        targets = [self._consume, self._unordered] + [
            (lambda i=i: self._ordered(i)) for i in range(self.s.ordered_producers)
        ]
        for t in targets:
            th = threading.Thread(target=_logged(t), daemon=True)
            th.start()
            self._threads.append(th)

    def drain(self) -> dict[str, int]:
        """Stop sending, wait for every outcome, then consume until every acknowledged message
        arrived, nothing new came for drain_idle_s, or the drain deadline passed."""
        self.stop_sending.set()
        producers = self._threads[1:]
        for th in producers:
            th.join(timeout=self.s.send_timeout_ms / 1000 + 10)
        deadline = time.monotonic() + self.s.drain_deadline_s
        with self._lock:
            self._last_delivery = max(self._last_delivery, time.monotonic())
        while time.monotonic() < deadline:
            with self._lock:
                missing = len(self._acked - self._seen)
                idle = time.monotonic() - self._last_delivery
            if missing == 0 or idle > self.s.drain_idle_s:
                break
            time.sleep(0.1)
        self.stop_consuming.set()
        self._threads[0].join(timeout=10)
        with self._lock:
            return {"acked": len(self._acked), "missing": len(self._acked - self._seen)}


def _logged(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception:
            log.exception("chaos.workload_thread_failed")

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True, type=Path, help="history file (JSON lines)")
    ap.add_argument("--ordered-producers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=20.0, help="sends/s per producer")
    ap.add_argument("--request-timeout-ms", type=int, default=1_000)
    ap.add_argument(
        "--mode",
        default="queue",
        choices=("queue", "txn", "delay", "retry", "orderly", "proxy"),
        help="queue: this module's workload; proxy: chaos/proxy_workload.py (the official "
        "RocketMQ 5 client through --proxy); the others: chaos/lifecycle_workload.py",
    )
    ap.add_argument("--proxy", default="", help="proxy mode: the raftmq-proxy's host:port")
    args = ap.parse_args(argv)
    level = os.environ.get("CHAOS_CLIENT_LOG", "WARNING").upper()  # DEBUG to trace sends
    configure_logging(level)
    settings = WorkloadSettings(
        args.namesrv,
        args.topic,
        ordered_producers=args.ordered_producers,
        ordered_rate_per_s=args.rate,
        unordered_rate_per_s=args.rate,
        request_timeout_ms=args.request_timeout_ms,
        # Delayed messages and retries arrive seconds after the last send: wait for them.
        drain_idle_s=5.0 if args.mode == "queue" else 12.0,
        drain_deadline_s=30.0 if args.mode == "queue" else 45.0,
    )
    rec = Recorder()
    w: Workload
    if args.mode == "queue":
        w = Workload(settings, rec)
    elif args.mode == "proxy":
        if not args.proxy:
            ap.error("--mode proxy needs --proxy HOST:PORT (the raftmq-proxy)")
        from raftmq.chaos.proxy_workload import ProxyWorkload  # it imports this module

        w = ProxyWorkload(settings, rec, args.proxy)
    else:
        from raftmq.chaos.lifecycle_workload import LifecycleWorkload  # it imports this module

        w = LifecycleWorkload(settings, rec, args.mode)
    w.start()
    print("ready", flush=True)
    for line in sys.stdin:  # the harness's commands; EOF (harness gone) also drains
        if line.strip() == "drain":
            break
    summary = w.drain()
    rec.write_jsonl(args.out)
    print(f"drained acked={summary['acked']} missing={summary['missing']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
