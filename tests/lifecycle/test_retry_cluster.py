"""Retry with back-off and dead letters with real processes (issue 16 item 3): a PushConsumer whose
listener fails sends the message back; it returns from %RETRY%<group> under its original topic
with its reconsume count after the level's delay (short levels by the broker setting); past
max_reconsume_times it is in %DLQ%<group> with its original topic and id, `raftmq dlq` lists and
shows it, and `dlq resend` brings it back. Bad input gets typed errors."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_orderly import OrderlyPushConsumer
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import InvalidArgumentError, InvalidDelayError, MessageNotFoundError
from raftmq.common.pb import broker_pb2
from raftmq.common.retry import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
)
from raftmq.common.trace import MoveKind, MoveTrace
from raftmq.common.types import QueueRef
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
LEVELS = "250ms 500ms 750ms 1s 1250ms 1500ms 1750ms 2s 3s 4s 5s 6s 7s 8s 9s 10s 20s 30s"
RETRY_DELAYS_MS = (750, 1_000, 1_250)  # levels 3, 4, 5: the back-off of retries 1, 2, 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("retry"),
        (GROUP,),
        namesrvs=1,
        broker_args=["--delay-levels", LEVELS],
    )
    try:
        c.wait_leaders()
        yield c
    finally:
        c.close()


def run_cli(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "raftmq.ops.cli", "--namesrv", c.namesrv, "dlq", *args]
    env = {**os.environ, "COLUMNS": "300"}  # a wide table: ids are not cut
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, env=env)


class Recorder:
    """A listener that fails `fail_times` deliveries of each message, recording each delivery."""

    def __init__(self, fail_times: int) -> None:
        self.fail_times = fail_times
        self.lock = threading.Lock()
        self.seen: dict[bytes, list[tuple[int, ReceivedMessage]]] = {}

    def __call__(self, m: ReceivedMessage) -> ConsumeResult:
        with self.lock:
            got = self.seen.setdefault(m.body, [])
            got.append((time.monotonic_ns() // 1_000_000, m))
            n = len(got)
        if n <= self.fail_times:
            if n % 2:
                raise RuntimeError(f"listener fails delivery {n}")
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    def count(self, body: bytes) -> int:
        with self.lock:
            return len(self.seen.get(body, []))


def consumer(c: Cluster, group: str, topic: str, listener: Recorder, **kw: int) -> PushConsumer:
    return PushConsumer(
        c.namesrv,
        group,
        topic,
        listener,
        start_from=StartFrom.EARLIEST,
        commit_interval_ms=100,
        rebalance_interval_ms=1_000,
        heartbeat_interval_ms=1_000,
        **kw,
    )


def test_failing_n_times_delivers_n_plus_one_times_with_backoff(cluster: Cluster) -> None:
    topic, group = "retry-backoff", "g-retry-backoff"
    with Producer(cluster.namesrv) as p:
        sent = p.send(topic, b"flaky", keys=["k-flaky"])
    rec = Recorder(fail_times=3)
    with consumer(cluster, group, topic, rec):
        wait_until(lambda: rec.count(b"flaky") >= 4, 60, "the 4th delivery")
        time.sleep(1.5)  # a duplicate delivery would come within this
    deliveries = rec.seen[b"flaky"]
    assert len(deliveries) == 4, "failed 3 times: delivered 3 + 1 times, no more"
    for i, (_, m) in enumerate(deliveries):
        assert m.topic == topic, "the listener sees the original topic"
        assert m.body == b"flaky" and m.keys == ("k-flaky",)
        assert m.reconsume_times == i
        if i:
            assert m.properties[PROPERTY_ORIGIN_MESSAGE_ID] == sent.msg_id
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(deliveries)]
    for gap, delay in zip(gaps, RETRY_DELAYS_MS, strict=True):
        assert delay <= gap < delay + 10_000, f"gaps {gaps} against back-off {RETRY_DELAYS_MS}"
    with Admin(cluster.namesrv) as admin:
        assert sum(x.lag for x in admin.group_lag(group, topic)) == 0
        assert admin.dead_letters(group) == []


def test_past_the_limit_a_dead_letter_then_resent(cluster: Cluster) -> None:
    topic, group = "retry-dlq", "g-retry-dlq"
    with Producer(cluster.namesrv) as p:
        first = p.send(topic, b"ok-1")
        q = QueueRef(topic, first.broker_group, first.queue_id)
        poison = p.send(topic, b"poison", queue=q)
        p.send(topic, b"ok-2", queue=q)
    rec = Recorder(fail_times=1_000)
    rec_ok = {b"ok-1", b"ok-2"}

    def listen(m: ReceivedMessage) -> ConsumeResult:
        if m.body in rec_ok:
            with rec.lock:
                rec.seen.setdefault(m.body, []).append((0, m))
            return ConsumeResult.SUCCESS
        return rec(m)

    with (
        consumer(cluster, group, topic, listen, max_reconsume_times=2) as c,  # type: ignore[arg-type]
        Admin(cluster.namesrv) as admin,
    ):
        wait_until(lambda: len(admin.dead_letters(group)) == 1, 60, "the dead letter")
        [dead] = admin.dead_letters(group)
        assert rec.count(b"poison") == 3, "max_reconsume_times=2: 3 deliveries, then the DLQ"
        assert dead.topic == f"%DLQ%{group}" and dead.body == b"poison"
        assert dead.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == topic
        assert dead.properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] == poison.msg_id
        # The queue moved on past the poison: nothing is stuck, nothing skipped.
        wait_until(lambda: sum(x.lag for x in admin.group_lag(group, topic)) == 0, 30, "lag 0")
        assert rec.count(b"ok-1") == 1 and rec.count(b"ok-2") == 1
        assert c.stuck() == []

        out = run_cli(cluster, "list", "--group", group)
        assert out.returncode == 0, out.stderr
        assert dead.msg_id in out.stdout and poison.msg_id in out.stdout
        out = run_cli(cluster, "show", "--id", dead.msg_id)
        assert out.returncode == 0 and topic in out.stdout, out.stdout + out.stderr
        # The listener now succeeds: the resent message is consumed once, as new.
        rec.fail_times = 0
        out = run_cli(cluster, "resend", "--id", dead.msg_id)
        assert out.returncode == 0 and "resent" in out.stdout, out.stdout + out.stderr
        wait_until(lambda: rec.count(b"poison") == 4, 30, "the resent message")
        _, again = rec.seen[b"poison"][-1]
        assert again.topic == topic and again.reconsume_times == 0
        assert again.properties[PROPERTY_ORIGIN_MESSAGE_ID] == poison.msg_id
        assert len(admin.dead_letters(group)) == 1, "the dead letter itself stays"
        # Not a dead letter: a typed error, on the CLI one line and exit 1.
        with pytest.raises(InvalidArgumentError, match="not a dead-letter topic"):
            admin.resend_dead_letter(poison.msg_id)
        out = run_cli(cluster, "resend", "--id", poison.msg_id)
        assert out.returncode == 1 and "not a dead-letter topic" in out.stderr
        assert "Traceback" not in out.stderr


def test_orderly_dead_letters_like_a_push_consumer(cluster: Cluster) -> None:
    """One dead-letter path: an orderly consumer's dead letter goes through the broker's
    send-back like a push consumer's, so the copies say the same (original topic and id, the
    count, the limit), `dlq show` shows both alike, the broker logs both and both are traced."""
    topic = "retry-dlq-kinds"
    with Producer(cluster.namesrv) as p:
        poison = {kind: p.send(topic, f"poison-{kind}".encode()) for kind in ("push", "orderly")}
    groups = {"push": "g-dlq-push", "orderly": "g-dlq-orderly"}

    def fail(kind: str) -> Callable[[ReceivedMessage], ConsumeResult]:
        def listen(m: ReceivedMessage) -> ConsumeResult:
            if m.body == f"poison-{kind}".encode():
                raise RuntimeError("this message always fails")
            return ConsumeResult.SUCCESS

        return listen

    orderly = OrderlyPushConsumer(
        cluster.namesrv,
        groups["orderly"],
        topic,
        fail("orderly"),
        start_from=StartFrom.EARLIEST,
        max_reconsume_times=1,
        suspend_ms=50,
        heartbeat_interval_ms=300,
        lock_renew_interval_ms=1_000,
        lock_live_ms=3_000,
        lock_retry_ms=200,
        trace=True,
    ).start()
    push = PushConsumer(
        cluster.namesrv,
        groups["push"],
        topic,
        fail("push"),
        start_from=StartFrom.EARLIEST,
        max_reconsume_times=1,
        rebalance_interval_ms=1_000,
        heartbeat_interval_ms=300,
        trace=True,
    ).start()
    dead: dict[str, ReceivedMessage] = {}
    try:
        with Admin(cluster.namesrv) as admin:
            for kind, group in groups.items():
                wait_until(lambda g=group: len(admin.dead_letters(g)) == 1, 60, f"{kind} DLQ")
                [dead[kind]] = admin.dead_letters(group)
    finally:
        orderly.close()  # flushes the traces
        push.close()
    shown: dict[str, set[str]] = {}
    for kind, m in dead.items():
        assert m.topic == f"%DLQ%{groups[kind]}" and m.body == f"poison-{kind}".encode()
        props = m.properties
        assert props[PROPERTY_DLQ_ORIGIN_TOPIC] == props[PROPERTY_RETRY_TOPIC] == topic
        assert props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] == poison[kind].msg_id
        assert props[PROPERTY_ORIGIN_MESSAGE_ID] == poison[kind].msg_id
        assert (props[PROPERTY_RECONSUME_TIME], props[PROPERTY_MAX_RECONSUME_TIMES]) == ("2", "1")
        out = run_cli(cluster, "show", "--id", m.msg_id)
        assert out.returncode == 0, out.stderr
        assert topic in out.stdout and poison[kind].msg_id in out.stdout
        assert re.search(r"failures\s*│\s*2\b", out.stdout), out.stdout
        # The push copy comes from its retry message, which was a delayed one (TIMER_OUT_MS).
        shown[kind] = set(re.findall(r"property (\S+)", out.stdout)) - {"TIMER_OUT_MS"}
    assert shown["orderly"] == shown["push"]
    logs = "".join(proc.log.read_text(errors="replace") for proc in cluster.procs())
    for kind, group in groups.items():
        assert f"broker.dead_letter group={group} msg_id=" in logs, f"{kind}: not the broker's"
    with Admin(cluster.namesrv) as admin:
        for kind, m in dead.items():
            t = admin.message_trace(poison[kind].msg_id)
            moves = [r for r in t.records if isinstance(r, MoveTrace)]
            assert [r.new_msg_id for r in moves if r.move is MoveKind.DEAD_LETTER] == [m.msg_id]
            assert all(r.group == groups[kind] for r in moves)
        # The push group's first failure went to %RETRY% at level 3 of this cluster's levels:
        # its trace shows that wait (issue 26: every retry step read "delay 0 ms").
        t = admin.message_trace(poison["push"].msg_id)
        retries = [r for r in t.records if isinstance(r, MoveTrace) and r.move is MoveKind.RETRY]
        assert [r.delay_ms for r in retries] == [RETRY_DELAYS_MS[0]], retries


def test_send_back_bad_input(cluster: Cluster) -> None:
    with Producer(cluster.namesrv) as p:
        sent = p.send("retry-bad", b"x")
    with Admin(cluster.namesrv) as admin:
        leader = next(g.leader_address for g in admin.groups() if g.broker_group == GROUP)
        stub = admin._stub(leader)

        def send_back(**kw: object) -> None:
            req = broker_pb2.ConsumerSendBackRequest(**kw)  # type: ignore[arg-type]
            admin._rpc(lambda: stub.ConsumerSendBack(req, timeout=10))

        with pytest.raises(InvalidDelayError, match="delay level 30 is out of range"):
            send_back(consumer_group="g", msg_id=sent.msg_id, max_reconsume_times=3, delay_level=30)
        with pytest.raises(InvalidArgumentError, match="max_reconsume_times"):
            send_back(consumer_group="g", msg_id=sent.msg_id, max_reconsume_times=-1)
        with pytest.raises(InvalidArgumentError, match="reconsume_times -2 is outside"):
            send_back(consumer_group="g", msg_id=sent.msg_id, max_reconsume_times=3,
                      reconsume_times=-2)  # fmt: skip
        with pytest.raises(InvalidArgumentError):
            send_back(consumer_group="%DLQ%g", msg_id=sent.msg_id, max_reconsume_times=3)
        with pytest.raises(MessageNotFoundError):
            send_back(consumer_group="g", msg_id=sent.msg_id[:-4] + "00FF", max_reconsume_times=3)
        assert admin.dead_letters("g") == []
