"""Message trace against a real broker group (issue 16 item 4): a producer and consumers with
trace=True record send and consume traces into RMQ_SYS_TRACE_TOPIC; Admin.message_trace and
`raftmq message trace --id` give the path (send, store, consume, local retries, the dead-letter
move); an unknown or untraced id is a typed error; tracing off records nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_orderly import DeadLetter, OrderlyPushConsumer
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage, SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.client.trace import TraceSender, _SendDone
from raftmq.common.errors import InvalidMessageIdError, OutcomeUnknownError, TraceNotFoundError
from raftmq.common.pb import common_pb2
from raftmq.common.trace import (
    TRACE_TOPIC,
    ConsumeTrace,
    MoveTrace,
    SendTrace,
    TraceBuffer,
    encode_record,
)
from raftmq.ops.procs import child_env
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "traced-topic"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("trace"), (GROUP,), namesrvs=1)
    try:
        c.wait_leaders()
        with Admin(c.namesrv) as admin:
            admin.create_topic(TOPIC, queues=2)
        yield c
    finally:
        c.close()


def cli(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftmq.ops.cli", "--namesrv", c.namesrv, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**child_env(), "COLUMNS": "250"},
    )


def test_trace_of_send_store_consume_retry_and_dead_letter(cluster: Cluster) -> None:
    with Producer(cluster.namesrv, trace=True) as producer:
        plain = producer.send(TOPIC, b"plain", keys=("k-plain",), tags="A")
        retried = producer.send(TOPIC, b"retried", keys=("k-retried",))
        dead = producer.send(TOPIC, b"dead", keys=("k-dead",))

    lock = threading.Lock()
    failures: dict[str, int] = {}
    done: set[str] = set()
    dead_letters: list[DeadLetter] = []

    def orderly(m: ReceivedMessage) -> ConsumeResult:
        with lock:
            if m.msg_id == dead.msg_id:
                return ConsumeResult.RECONSUME_LATER
            if m.msg_id == retried.msg_id and failures.get(m.msg_id, 0) < 1:
                failures[m.msg_id] = 1
                raise RuntimeError("the first delivery fails")
            done.add(m.msg_id)
        return ConsumeResult.SUCCESS

    seen: set[str] = set()

    def plain_listener(m: ReceivedMessage) -> ConsumeResult:
        with lock:
            seen.add(m.msg_id)
        return ConsumeResult.SUCCESS

    consumer = OrderlyPushConsumer(
        cluster.namesrv,
        "trace-orderly",
        TOPIC,
        orderly,
        start_from=StartFrom.EARLIEST,
        max_reconsume_times=1,
        suspend_ms=50,
        heartbeat_interval_ms=300,
        lock_renew_interval_ms=1_000,
        lock_live_ms=3_000,
        lock_retry_ms=200,
        on_dead_letter=dead_letters.append,
        trace=True,
    ).start()
    push = PushConsumer(
        cluster.namesrv,
        "trace-push",
        TOPIC,
        plain_listener,
        start_from=StartFrom.EARLIEST,
        heartbeat_interval_ms=300,
        trace=True,
    ).start()
    try:
        wait_until(lambda: len(done) == 2 and dead_letters, 60, "the orderly consumer")
        wait_until(lambda: len(seen) == 3, 60, "the push consumer")
    finally:
        consumer.close()  # flushes its traces
        push.close()
    with Producer(cluster.namesrv) as untraced_producer:  # sent untraced, never consumed
        untraced = untraced_producer.send(TOPIC, b"untraced")

    with Admin(cluster.namesrv) as admin:
        t = admin.message_trace(plain.msg_id)
        kinds = [s.step for s in t.steps()]
        assert kinds[:2] == ["send", "store"], kinds
        assert kinds.count("consume") == 2, kinds  # one per consumer group
        send = next(r for r in t.records if isinstance(r, SendTrace))
        assert (send.topic, send.queue_id, send.queue_offset) == (
            TOPIC,
            plain.queue_id,
            plain.queue_offset,
        )
        assert send.keys == ("k-plain",) and send.tags == "A" and send.success
        groups = {r.group for r in t.records if isinstance(r, ConsumeTrace)}
        assert groups == {"trace-orderly", "trace-push"}
        assert all(r.status == "success" for r in t.records if isinstance(r, ConsumeTrace)), (
            t.records
        )

        t = admin.message_trace(retried.msg_id)
        orderly_consumes = [
            r for r in t.records if isinstance(r, ConsumeTrace) and r.group == "trace-orderly"
        ]
        assert [(r.status, r.reconsume_times) for r in orderly_consumes] == [
            ("exception", 0),
            ("success", 1),
        ]

        t = admin.message_trace(dead.msg_id)
        orderly_consumes = [
            r for r in t.records if isinstance(r, ConsumeTrace) and r.group == "trace-orderly"
        ]
        assert [r.status for r in orderly_consumes] == ["reconsume_later"] * 2
        moves = [r for r in t.records if isinstance(r, MoveTrace)]
        assert len(moves) == 1 and moves[0].new_msg_id == dead_letters[0].dlq_msg_id
        steps = t.steps()
        assert steps[-1].step == "dlq" or "dlq" in [s.step for s in steps]
        assert {m.msg_id for m in t.stored} == {dead.msg_id, dead_letters[0].dlq_msg_id}

        with pytest.raises(TraceNotFoundError, match="no trace of message"):
            admin.message_trace(untraced.msg_id)
        unknown = untraced.msg_id[:-8] + "7FFFFFFF"
        with pytest.raises(TraceNotFoundError):
            admin.message_trace(unknown)
        with pytest.raises(InvalidMessageIdError):
            admin.message_trace("not-an-id")

    out = cli(cluster, "message", "trace", "--id", retried.msg_id)
    assert out.returncode == 0, out.stderr
    for word in ("send", "store", "consume", "exception", "success", retried.msg_id):
        assert word in out.stdout, out.stdout
    out = cli(cluster, "message", "trace", "--id", unknown)
    assert out.returncode == 1
    assert "TRACE_NOT_FOUND" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_trace_is_off_by_default_and_never_fails_a_send(cluster: Cluster) -> None:
    with Producer(cluster.namesrv) as producer:
        assert producer._tracer is None
        producer.send(TOPIC, b"x")
    # A buffer of one record: the rest are dropped and counted, the sends all succeed.
    sender = TraceSender(cluster.namesrv, buffer=TraceBuffer(max_buffered=1, max_age_ms=60_000))
    try:
        with Producer(cluster.namesrv) as producer:
            producer._tracer = sender
            results = [producer.send(TOPIC, b"y") for _ in range(5)]
        assert all(r.msg_id for r in results)
        assert sender.dropped >= 3
    finally:
        sender.close()
    with Admin(cluster.namesrv) as admin:
        assert TRACE_TOPIC in admin.list_topics()


def test_a_send_hook_line_is_the_records_encoding() -> None:
    """The trace thread encodes a send without building its SendTrace: the bytes must be
    encode_record's, for a stored send and a failed one."""
    msg = common_pb2.Message(body=b"b", keys=["k1", "k2"], tags="T")
    ok: Future[SendResult] = Future()
    ok.set_result(SendResult("broker-a-" + "0" * 31 + "1", "t", "broker-a", 3, 77))
    failed: Future[SendResult] = Future()
    failed.set_exception(OutcomeUnknownError("maybe"))
    for fut in (ok, failed):
        done = _SendDone("t", msg, "p-1", "host@1", 1_700_000_000_000, 4, fut)
        assert done.line() == encode_record(done.record())
        assert done.msg_id() == done.record().msg_id
    buf = TraceBuffer()
    assert buf.add_encoded("x", b"{}", 0) and len(buf) == 1
