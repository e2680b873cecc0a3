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
from raftmq.client.producer.sender import Pending
from raftmq.client.trace import TraceSender, _SendsDone, sends_hook
from raftmq.common.errors import InvalidMessageIdError, OutcomeUnknownError, TraceNotFoundError
from raftmq.common.pb import common_pb2
from raftmq.common.trace import (
    TRACE_TOPIC,
    ConsumeTrace,
    MalformedTraceError,
    MoveTrace,
    SendTrace,
    TraceBuffer,
    decode_batch,
)
from raftmq.common.types import QueueRef
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
            producer._sender.on_settled = sends_hook(sender, producer.producer_id, "c")
            results = [producer.send(TOPIC, b"y") for _ in range(5)]
        assert all(r.msg_id for r in results)
        assert sender.dropped >= 3
    finally:
        sender.close()
    with Admin(cluster.namesrv) as admin:
        assert TRACE_TOPIC in admin.list_topics()


def test_a_settled_batch_is_one_line_per_32_messages_read_back_as_sends() -> None:
    """The hook records a settled request's batch; the trace thread writes one `sends` line per
    slice of at most 32 messages (a trace message's keys are the ids it traces), which reads
    back as the SendTrace of each message: ids, offsets, keys, tags, cost; a failed batch as
    failed sends without ids."""
    items = []
    for i in range(70):
        msg = common_pb2.Message(
            body=b"b", keys=[f"k{i}"], tags="T" if i % 2 else "", born_timestamp_ms=1_000 + i
        )
        fut: Future[SendResult] = Future()
        fut.set_result(SendResult(f"id-{i}", "t", "broker-a", 3, 500 + i))
        items.append(Pending(msg, fut, 1, True))
    done = _SendsDone("t", items, "p-1", "host@1", 2_000)
    lines = list(done.lines(32))
    assert [len(ids) for ids, _ in lines] == [32, 32, 6]
    assert lines[1][0] == tuple(f"id-{i}" for i in range(32, 64))
    got = decode_batch(b"\n".join(line for _, line in lines))
    assert got[33] == SendTrace(
        "id-33", 1_033, "t", "p-1", "host@1", ("k33",), "T", "broker-a", 3, 533, 0, 967
    )
    assert len(got) == 70 and all(isinstance(r, SendTrace) for r in got)
    assert [r.tags for r in got if isinstance(r, SendTrace)][34] is None
    assert [r.queue_offset for r in got if isinstance(r, SendTrace)] == list(range(500, 570))

    failed: Future[SendResult] = Future()
    failed.set_exception(OutcomeUnknownError("maybe"))
    bad = _SendsDone("t", [Pending(items[0].msg, failed, 1, True)], "p-1", "h", 1_500)
    [(ids, bad_line)] = bad.lines(32)
    [rec] = decode_batch(bad_line)
    assert ids == ("",) and isinstance(rec, SendTrace)
    assert (rec.msg_id, rec.success, rec.queue_offset, rec.cost_ms) == ("", False, -1, 500)

    buf = TraceBuffer()
    for ids, line in lines:
        assert buf.add_encoded(ids, line, 0)
    assert len(buf) == 70
    batches = [buf.take(0, flush=True) for _ in range(3)]
    assert [b.count for b in batches if b is not None] == [32, 32, 6]  # never over 32 keys
    assert batches[0] is not None and len(batches[0].keys) == 32
    with pytest.raises(MalformedTraceError, match=r"sends.m\[0\]"):
        decode_batch(bad_line.replace(b'["",1000', b'["",true'))


def test_each_message_of_a_batch_call_of_bodies_is_traced(cluster: Cluster) -> None:
    """The batch-first call's bare bodies travel as one buffered item (issue 24): a traced
    producer still records a send trace per message, with its own id and offset, including a
    request that also carries single sends of the same queue (one request: the linger holds
    them together)."""
    queue = QueueRef(TOPIC, GROUP, 1)
    with Producer(cluster.namesrv, trace=True, linger_ms=300) as producer:
        first = producer.send_async(TOPIC, b"single-0", queue=queue, keys=("k-single",))
        calls = producer.send_batch_future(TOPIC, [b"body-0", b"body-1", b"body-2"], queue=queue)
        last = producer.send_async(TOPIC, b"single-1", queue=queue)
        results = [first.result(30), *calls.result(30), last.result(30)]
        assert producer._sender.batches_sent == 1, "bodies and single sends in one request"
    offsets = [r.queue_offset for r in results]
    assert offsets == list(range(offsets[0], offsets[0] + 5)), "stored in call order"
    assert len({r.msg_id for r in results}) == 5
    with Admin(cluster.namesrv) as admin:
        for r in results:
            t = wait_until(lambda r=r: _sent(admin, r.msg_id), 30, f"the trace of {r.msg_id}")
            assert isinstance(t, SendTrace)
            assert (t.queue_id, t.queue_offset) == (1, r.queue_offset) and t.success
            assert t.keys == (("k-single",) if r is results[0] else ())


def _sent(admin: Admin, msg_id: str) -> SendTrace | None:
    try:
        t = admin.message_trace(msg_id)
    except TraceNotFoundError:
        return None
    return next((r for r in t.records if isinstance(r, SendTrace)), None)
