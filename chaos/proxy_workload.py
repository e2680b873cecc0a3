"""The chaos workload through the RocketMQ 5 API (`--mode proxy`, scenario proxy-leader-kill):
the official RocketMQ 5 Python client (PyPI `rocketmq-python-client`) sends through the
raftmq-proxy that the chaos runner starts in the cluster, and a SimpleConsumer of the same client
receives and acknowledges through it, while the nemesis kills the group's leader. Recorded like
chaos/workload.py, so the queue checker holds every acknowledged send to a delivery and the
availability checker holds the client to going on after the failover.

The official client's errors do not say whether the message was stored (a timeout may follow a
stored send): every failed send is `info` (indeterminate), never `fail`. A message received but
not acknowledged (an ack lost in the failover) comes back after its invisible duration: a
duplicate, legal under at-least-once and counted.

The official client registers the protobuf symbols apache.rocketmq.v2.* itself; this process
imports none of raftmq's generated v2 modules (only the SDK's own, whose names differ), so both
live in one interpreter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from raftmq.chaos.history import Recorder
from raftmq.chaos.workload import Workload, WorkloadSettings, _logged, body_of, parse_body

log = logging.getLogger("raftmq.chaos.proxy_workload")

PROXY_RATE_PER_S = 10.0  # sync sends of one client, one at a time
PROXY_GROUP = "chaos-proxy"
INVISIBLE_S = 8  # an unacknowledged message comes back this long after its receive
AWAIT_S = 1  # the SimpleConsumer's long polling
REQUEST_TIMEOUT_S = 5
MISSING = (
    "the official RocketMQ 5 Python client is missing: pip install rocketmq-python-client "
    "(the chaos extra)"
)


def _rocketmq() -> Any:
    """The official client's package (untyped: used through Any)."""
    try:
        import rocketmq  # type: ignore[import-untyped]
    except ImportError:
        raise SystemExit(MISSING) from None
    return rocketmq


class ProxyWorkload(Workload):
    def __init__(self, settings: WorkloadSettings, recorder: Recorder, endpoint: str) -> None:
        super().__init__(settings, recorder)
        self.endpoint = endpoint
        self._period = 1.0 / PROXY_RATE_PER_S

    def _config(self) -> Any:
        rm = _rocketmq()
        return rm.ClientConfiguration(
            self.endpoint, rm.Credentials(), request_timeout=REQUEST_TIMEOUT_S
        )

    def _send(self) -> None:
        rm = _rocketmq()
        name = "producer-rmq5"
        p = rm.Producer(self._config(), (self.s.topic,))
        p.startup()
        try:
            seq = 0
            next_at = time.monotonic()
            while not self.stop_sending.is_set():
                msg_id = f"rmq5-{seq}"
                seq += 1
                m = rm.Message()
                m.topic = self.s.topic
                m.body = body_of(msg_id, None)
                self.rec.record(name, "invoke", "send", {"id": msg_id, "key": None})
                try:
                    p.send(m)
                except Exception as exc:  # the client's errors do not say "not stored"
                    error = f"{type(exc).__name__}: {exc}"[:200]
                    self.rec.record(
                        name, "info", "send", {"id": msg_id, "key": None, "error": error}
                    )
                else:
                    self.rec.record(name, "ok", "send", {"id": msg_id, "key": None})
                    self._acknowledged(msg_id)
                next_at = max(next_at + self._period, time.monotonic() - self._period)
                self.stop_sending.wait(max(0.0, next_at - time.monotonic()))
        finally:
            p.shutdown()

    def _consume(self) -> None:
        rm = _rocketmq()
        name = "consumer-rmq5"
        c = rm.SimpleConsumer(
            self._config(),
            PROXY_GROUP,
            {self.s.topic: rm.FilterExpression("*")},
            await_duration=AWAIT_S,
        )
        c.startup()
        try:
            while not self.stop_consuming.is_set():
                try:
                    batch = c.receive(32, INVISIBLE_S)
                except Exception as exc:  # the proxy or the group between leaders: try again
                    log.info("chaos.rmq5_receive_failed %s", exc)
                    self.stop_consuming.wait(0.2)
                    continue
                for m in batch:
                    msg_id, _ = parse_body(m.body)
                    self.rec.record(
                        name,
                        "ok",
                        "recv",
                        {"id": msg_id, "key": None, "attempt": m.delivery_attempt},
                    )
                    with self._lock:
                        self._seen.add(msg_id)
                        self._last_delivery = time.monotonic()
                    try:
                        c.ack(m)
                    except Exception as exc:  # it comes back after INVISIBLE_S: a duplicate
                        log.info("chaos.rmq5_ack_failed %s %s", msg_id, exc)
        finally:
            c.shutdown()

    def start(self) -> None:
        """The consumer first: Workload.drain joins threads[1:] as producers, threads[0] last."""
        _rocketmq()  # missing: say so before any thread starts
        targets: list[Callable[[], None]] = [self._consume, self._send]
        for t in targets:
            th = threading.Thread(target=_logged(t), daemon=True)
            th.start()
            self._threads.append(th)
