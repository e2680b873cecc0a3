"""Issue 4's acceptance: under steady sends and a consumer, SIGKILL broker-a's leader five times
(restarting it each time): every acknowledged message is consumed, per-queue order of the
acknowledged messages holds, and the NameServers route to each new leader within a second of
its election. A clean stop (SIGTERM) of the leader causes no failed send at all."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import OutcomeUnknownError, RequestTimeoutError
from raftmq.common.types import QueueRef
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import parse
from tests.controller.test_controller_cluster import broker_leader, namesrv_leaders, spec_text
from tests.harness.local_cluster import free_ports
from tests.harness.procs import wait_until


def led_by_other(r: ClusterRunner, node: str) -> Callable[[], bool]:
    return lambda: broker_leader(r)[0] not in ("", node)


def routed_to(r: ClusterRunner, want: tuple[str, int]) -> Callable[[], bool]:
    return lambda: all(x == want for x in namesrv_leaders(r))


def acked_beyond(sender: Sender, count: int) -> Callable[[], bool]:
    return lambda: len(sender.acked) > count


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ClusterRunner]:
    r = ClusterRunner(parse(spec_text(free_ports(14), tmp_path / "data")))
    try:
        r.start_all()
        yield r
    finally:
        r.stop_all()


class Sender:
    """One producer thread: sync sends, each body unique, keys spread over four queues."""

    def __init__(self, namesrv: str, topic: str) -> None:
        self.acked: list[tuple[float, SendResult, bytes]] = []
        self.failed = 0
        self._stop = threading.Event()
        self._namesrv = namesrv
        self._topic = topic
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with Producer(self._namesrv, send_timeout_ms=15_000) as p:
            i = 0
            while not self._stop.is_set():
                body = f"m{i}".encode()
                try:
                    r = p.send(self._topic, body, sharding_key=f"k{i % 4}")
                    self.acked.append((time.monotonic(), r, body))
                except Exception:
                    self.failed += 1
                i += 1
                time.sleep(0.002)


def namesrv_str(r: ClusterRunner) -> str:
    return ",".join(f"{p.host}:{p.ports[0]}" for p in r.processes() if p.role == "namesrv")


def serving_topic(r: ClusterRunner, topic: str, queues: int) -> str:
    """Wait for broker-a's leader, create `topic` and wait for its route; the NameServers."""
    ns = namesrv_str(r)
    wait_until(lambda: broker_leader(r)[0], 30, "a broker leader")
    with Admin(ns) as admin:
        # The NameServers learn the leader from its report a moment after the node knows it.
        wait_until(lambda: all(g.leader_address for g in admin.groups()), 30, "the leader routed")
        admin.create_topic(topic, queues=queues)
    # On every NameServer: a producer may ask either (one that had not heard of the topic yet
    # answered NoRouteError on a loaded machine).
    for one in ns.split(","):
        with Admin(one) as admin:
            wait_until(
                lambda: len(admin.route(topic).write_queues()) == queues, 20, f"route at {one}"
            )
    return ns


def test_five_leader_kills_lose_nothing(runner: ClusterRunner) -> None:
    r = runner
    ns = serving_topic(r, "failover", 4)
    sender = Sender(ns, "failover")
    sender.start()
    route_delays = []
    try:
        wait_until(lambda: len(sender.acked) > 50, 30, "sends to flow")
        for _ in range(5):
            node, _ = broker_leader(r)
            r.kill(f"broker-a-{node}", signal.SIGKILL)
            wait_until(led_by_other(r, node), 30, "a new leader")
            new, term = broker_leader(r)
            seen = time.monotonic()
            wait_until(
                routed_to(r, (new, term)),
                10,
                "NameServers to route to the new leader",
                interval_s=0.01,
            )
            route_delays.append(time.monotonic() - seen)
            before = len(sender.acked)
            wait_until(acked_beyond(sender, before + 20), 30, "sends to resume")
            r.start(f"broker-a-{node}")
    finally:
        sender.stop()
    assert max(route_delays) < 1.0, route_delays
    acked = sender.acked
    print(f"acked={len(acked)} failed={sender.failed} route_delays={route_delays}")
    # Per queue, acknowledgement order is queue-offset order.
    by_queue: dict[int, list[int]] = {}
    for _, res, _ in acked:
        by_queue.setdefault(res.queue_id, []).append(res.queue_offset)
    for offsets in by_queue.values():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    # Every acknowledged message is there, exactly where it was acknowledged.
    want = {(res.queue_id, res.queue_offset): body for _, res, body in acked}
    got: dict[tuple[int, int], bytes] = {}
    with PullConsumer(ns, "g-failover", start_from=StartFrom.EARLIEST) as c:
        c.subscribe("failover")
        deadline = time.monotonic() + 60
        while not set(want) <= set(got) and time.monotonic() < deadline:
            for m in c.poll(500):
                got[(m.queue_id, m.queue_offset)] = m.body
    missing = [k for k in want if got.get(k) != want[k]]
    assert not missing, f"{len(missing)} acknowledged messages lost or changed: {missing[:5]}"
    bodies = list(got.values())
    assert len(bodies) == len(set(bodies)), "a message was stored twice"


def test_clean_stop_of_the_leader_fails_no_send(runner: ClusterRunner) -> None:
    r = runner
    ns = serving_topic(r, "handoff", 2)
    sender = Sender(ns, "handoff")
    sender.start()
    try:
        wait_until(lambda: len(sender.acked) > 50, 30, "sends to flow")
        for _ in range(2):
            node, _ = broker_leader(r)
            r.kill(f"broker-a-{node}", signal.SIGTERM)
            wait_until(led_by_other(r, node), 30, "the hand-off")
            before = len(sender.acked)
            wait_until(acked_beyond(sender, before + 20), 30, "sends to resume")
            r.start(f"broker-a-{node}")
    finally:
        sender.stop()
    gaps = [b[0] - a[0] for a, b in zip(sender.acked, sender.acked[1:], strict=False)]
    print(f"acked={len(sender.acked)} failed={sender.failed} longest gap={max(gaps):.3f}s")
    assert sender.failed == 0


def test_sends_stuck_behind_an_unanswered_one_end_within_their_send_timeout(
    runner: ClusterRunner,
) -> None:
    """broker-a answers nothing (its three nodes SIGSTOPped: connections open, no replies). The
    send timeout bounds every message from its own send() on, also those that waited behind
    the unanswered request on their queue (they used to get a fresh timeout when they left).
    Each ends as OutcomeUnknownError (it may have reached the paused leader) or, if it never
    left the producer, RequestTimeoutError. After the group resumes the queue holds, in order
    and once each, "before", some of the unknown ones, and "after"."""
    r = runner
    ns = serving_topic(r, "stuck", 1)
    brokers = [p.name for p in r.processes() if p.role == "broker"]
    timeout_s = 2.0
    sent: list[tuple[float, bytes, Future[SendResult]]] = []
    ended: list[tuple[float, BaseException | None]] = []
    with Producer(ns, send_timeout_ms=int(timeout_s * 1000), request_timeout_ms=500) as p:
        p.send("stuck", b"before", sharding_key="k")
        for name in brokers:
            r.kill(name, signal.SIGSTOP)
        try:
            for i in range(20):
                body = f"m{i}".encode()
                sent.append((time.monotonic(), body, p.send_async("stuck", body, sharding_key="k")))
                time.sleep(0.3 if i == 0 else 0.01)  # m0 in flight, the others behind it
            for _, _, f in sent:
                exc = f.exception(timeout=2 * timeout_s + 10)
                ended.append((time.monotonic(), exc))
        finally:
            for name in brokers:
                r.kill(name, signal.SIGCONT)
        late = [
            round(end - start, 2)
            for (start, _, _), (end, _) in zip(sent, ended, strict=True)
            if end - start > timeout_s + 0.5
        ]
        assert not late, f"outcomes later than the send timeout: {late}"
        kinds = {type(e).__name__ for _, e in ended}
        assert kinds <= {"OutcomeUnknownError", "RequestTimeoutError"}, kinds
        assert isinstance(ended[0][1], OutcomeUnknownError), ended[0]
        wait_until(lambda: broker_leader(r)[0], 30, "broker-a to serve again")
        after = p.send("stuck", b"after", sharding_key="k")
    never_sent = {
        body
        for (_, body, _), (_, e) in zip(sent, ended, strict=True)
        if isinstance(e, RequestTimeoutError)
    }
    with PullConsumer(ns, "g-stuck", start_from=StartFrom.EARLIEST) as c:
        q = QueueRef("stuck", "broker-a", after.queue_id)
        c.assign([q])
        c.seek_to_beginning(q)
        bodies: list[bytes] = []
        deadline = time.monotonic() + 30
        while b"after" not in bodies and time.monotonic() < deadline:
            bodies += [m.body for m in c.poll(500)]
    assert bodies[0] == b"before" and bodies[-1] == b"after", bodies
    middle = bodies[1:-1]
    order = [body for _, body, _ in sent]
    assert middle == sorted(set(middle), key=order.index), f"reordered or twice: {middle}"
    assert not never_sent & set(middle), f"stored though never sent: {never_sent & set(middle)}"
