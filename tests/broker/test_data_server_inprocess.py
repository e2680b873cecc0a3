"""The pull generator and the framed data server in one process: a BrokerNode on a MemoryLog
(raftlog/memory.py) with real lmdb stores, its DataServer on a loopback port, FrameClients.

The generator's waits and the closing flag; held pulls parked as loop futures and woken by the
dispatcher (no thread per pull); sends answered through the OutcomeBook callbacks; one loop
wake-up for many completions (LoopWaker)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.broker.data_server import DataServer
from raftmq.broker.dispatcher_thread import DispatcherSettings
from raftmq.broker.held_pulls import HoldTimers
from raftmq.broker.node import BrokerNode, _LoopCommits, _Request
from raftmq.broker.pull import PullResult, PullStatus, PullSteps, WaitMessage
from raftmq.broker.pull_plan import LONG_POLL_SLICE_MS
from raftmq.broker.rows import ChunkOutcome
from raftmq.broker.store import MessageStore
from raftmq.broker.wakeups import LoopWaker
from raftmq.common import record_batch
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    RaftMQError,
)
from raftmq.common.pb import broker_pb2, common_pb2
from raftmq.common.quota import Flow
from raftmq.common.record_batch import ProduceBatch
from raftmq.common.transport import FrameClient, LoopThread
from raftmq.raftlog.errors import NotLeaderError
from raftmq.raftlog.memory import MemoryLog
from raftmq.raftlog.record import Committed
from tests.broker.test_node_decisions import ME_RAFT, PEER_RAFT, make_node, msg, send, settings


@pytest.fixture
def node(tmp_path: Path) -> Iterator[BrokerNode]:
    n = make_node(tmp_path, MemoryLog(ME_RAFT))
    yield n
    n.close()


def steps(node: BrokerNode, topic: str, queue_id: int, offset: int, wait_ms: int) -> PullSteps:
    return node.pulls.steps(
        "g",
        topic,
        queue_id,
        offset,
        32,
        sql=False,
        expression="*",
        max_wait_ms=wait_ms,
        allow_follower_read=False,
        max_bytes=0,
        deadline=time.monotonic() + 10,
    )


def finish(gen: PullSteps, closing: bool) -> PullResult:
    with pytest.raises(StopIteration) as done:
        gen.send(closing)
    result: PullResult = done.value.value
    return result


# ---- the generator ------------------------------------------------------------------------------


def indexed(node: BrokerNode) -> None:
    """A send is answered at its commit and indexed after (issue 29): these tests plan pulls
    against an index that holds what was sent (a pull behind it catches up first)."""
    assert node.wait_dispatched(node.rlog.committed_index, 5)


def test_steps_yield_a_wait_at_the_queue_end_and_find_what_arrived_meanwhile(
    node: BrokerNode,
) -> None:
    send(node, "T", 0)
    indexed(node)
    gen = steps(node, "T", 0, 1, 5_000)
    wait = next(gen)
    assert isinstance(wait, WaitMessage)
    assert (wait.topic, wait.queue_id, wait.offset) == ("T", 0, 1)
    assert 0 < wait.wait_ms <= 1_000  # re-planned at least once a second
    send(node, "T", 0)
    assert node.wait_dispatched(node.rlog.committed_index, 5)
    result = finish(gen, False)
    assert (result.status, result.next_offset) == (PullStatus.FOUND, 2)
    assert [m.queue_offset for m in result.messages] == [1]


def test_steps_answer_at_once_without_waiting_when_there_is_data_or_no_time(
    node: BrokerNode,
) -> None:
    send(node, "T", 0, 3)
    indexed(node)
    with pytest.raises(StopIteration) as done:
        next(steps(node, "T", 0, 0, 5_000))
    assert done.value.value.status == PullStatus.FOUND
    with pytest.raises(StopIteration) as done:
        next(steps(node, "T", 0, 3, 0))
    assert done.value.value.status == PullStatus.NO_NEW_MSG
    with pytest.raises(OffsetOutOfRangeError):
        next(steps(node, "T", 0, 99, 5_000))


def test_closing_driver_ends_a_held_pull_with_no_new_message(node: BrokerNode) -> None:
    send(node, "T", 0)
    indexed(node)
    gen = steps(node, "T", 0, 1, 5_000)
    assert isinstance(next(gen), WaitMessage)
    result = finish(gen, True)
    assert (result.status, result.next_offset, result.max_offset) == (PullStatus.NO_NEW_MSG, 1, 1)


def test_timed_out_wait_replans_and_answers_no_new_message_after_the_hold(
    node: BrokerNode,
) -> None:
    send(node, "T", 0)
    indexed(node)
    gen = steps(node, "T", 0, 1, 300)
    t0 = time.monotonic()
    wait = next(gen)
    while True:  # a driver whose waits all time out
        assert isinstance(wait, WaitMessage)
        time.sleep(wait.wait_ms / 1000)
        try:
            wait = gen.send(False)
        except StopIteration as done:
            result: PullResult = done.value
            break
    assert result.status == PullStatus.NO_NEW_MSG
    assert 0.25 <= time.monotonic() - t0 < 2


# ---- the waker ----------------------------------------------------------------------------------


def post_all_at_once(
    io: LoopThread, waker: LoopWaker, futs: list[asyncio.Future[int]]
) -> list[int]:
    """Complete futs[i] with i through the waker from this thread, every post made while the loop
    is held busy (so all wait for one drain), and the results once the loop has delivered them."""
    barrier = threading.Event()
    io.loop.call_soon_threadsafe(barrier.wait, 5)
    for i, f in enumerate(futs):
        waker.set_result(f, i)
    barrier.set()

    async def collect() -> list[int]:
        return list(await asyncio.gather(*futs))

    return io.run(collect(), 5)


def test_loop_waker_coalesces_completions_from_another_thread() -> None:
    with LoopThread("test-waker") as io:
        waker = LoopWaker(io.loop)

        async def make() -> list[asyncio.Future[int]]:
            return [io.loop.create_future() for _ in range(500)]

        futs = io.run(make())
        assert post_all_at_once(io, waker, futs) == list(range(500))
        assert waker.completions == 500
        assert waker.wakeups <= 2  # one per burst, not one per future


def test_loop_waker_completes_at_most_its_bound_per_loop_turn() -> None:
    """A message that wakes a thousand held pulls must not run all their reads in one loop turn
    ahead of the loop's timers and other requests' answers: completions spread over turns, in
    the order they were posted, and none is lost."""
    with LoopThread("test-waker-bound") as io:
        waker = LoopWaker(io.loop, max_per_turn=10)
        turn = 0
        done_in: list[tuple[int, int]] = []  # (turn, future's number) as each completes

        async def make() -> list[asyncio.Future[int]]:
            def tick() -> None:
                nonlocal turn
                turn += 1
                if len(done_in) < 95:
                    io.loop.call_soon(tick)

            io.loop.call_soon(tick)
            futs = [io.loop.create_future() for _ in range(95)]
            for i, f in enumerate(futs):
                f.add_done_callback(lambda _, i=i: done_in.append((turn, i)))
            return futs

        futs = io.run(make())
        assert post_all_at_once(io, waker, futs) == list(range(95))
        assert [i for _, i in done_in] == list(range(95))
        per_turn: dict[int, int] = {}
        for t, _ in done_in:
            per_turn[t] = per_turn.get(t, 0) + 1
        assert max(per_turn.values()) <= 10, per_turn
        assert len(per_turn) >= 10


# ---- the data server in process -----------------------------------------------------------------


@pytest.fixture
def served(node: BrokerNode) -> Iterator[tuple[DataServer, LoopThread, FrameClient]]:
    server = DataServer(node, node.settings)
    address = server.start("127.0.0.1", 0)
    host, _, port = address.rpartition(":")
    io = LoopThread("test-client")
    client = FrameClient(host, int(port), loop=io.loop)
    try:
        yield server, io, client
    finally:
        io.run(client.close())
        io.stop()
        server.stop(1.0)


def call(client: FrameClient, method: DataMethod, req: object, timeout_s: float = 10) -> bytes:
    payload = req.SerializeToString()  # type: ignore[attr-defined]
    return client.call_threadsafe(method, payload, timeout_s).result(timeout_s + 1)


def send_req(topic: str, queue_id: int, body: bytes) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=body)]
    )


def pull_req(topic: str, queue_id: int, offset: int, wait_ms: int) -> broker_pb2.PullMessageRequest:
    return broker_pb2.PullMessageRequest(
        consumer_group="g", topic=topic, queue_id=queue_id, offset=offset, max_wait_ms=wait_ms
    )


def test_held_pulls_park_without_threads_and_a_send_wakes_them(
    node: BrokerNode, served: tuple[DataServer, LoopThread, FrameClient]
) -> None:
    server, _, client = served
    sent = broker_pb2.SendMessageResponse.FromString(
        call(client, DataMethod.SEND_MESSAGE, send_req("T", 0, b"first"))
    )
    assert [r.queue_offset for r in sent.results] == [0]
    threads_before = threading.active_count()
    pulls = [
        client.call_threadsafe(
            DataMethod.PULL_MESSAGE,
            pull_req("T", q, 1 if q == 0 else 0, 8_000).SerializeToString(),
            15,
        )
        for q in range(4)
        for _ in range(50)
    ]
    deadline = time.monotonic() + 5
    while server.held_pulls < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.held_pulls == 200
    assert threading.active_count() <= threads_before + 1  # no thread per held pull
    wakeups = server.loop_wakeups
    t0 = time.monotonic()
    call(client, DataMethod.SEND_MESSAGE, send_req("T", 0, b"second"))
    woken = [f.result(5) for f in pulls[:50]]
    assert time.monotonic() - t0 < 1.0
    for raw in woken:
        answer = broker_pb2.PullMessageResponse.FromString(raw)
        assert answer.status == broker_pb2.FOUND
        assert [m.message.body for m in answer.messages] == [b"second"]
    assert server.held_pulls == 150  # the other queues' pulls are still held
    # the send's answer and the 50 pulls it satisfied: a handful of wake-ups, not 51
    assert server.loop_wakeups - wakeups <= 5
    server.stop(2.0)  # closing answers the held pulls at once
    for f in pulls[50:]:
        answer = broker_pb2.PullMessageResponse.FromString(f.result(3))
        assert answer.status == broker_pb2.NO_NEW_MSG


def test_send_duplicate_offsets_and_errors_over_frames(
    node: BrokerNode, served: tuple[DataServer, LoopThread, FrameClient]
) -> None:
    _, _, client = served
    req = send_req("T", 1, b"x")
    req.producer_id, req.first_sequence = "p1", 0
    first = broker_pb2.SendMessageResponse.FromString(call(client, DataMethod.SEND_MESSAGE, req))
    again = broker_pb2.SendMessageResponse.FromString(call(client, DataMethod.SEND_MESSAGE, req))
    assert [(r.queue_offset, r.duplicate) for r in first.results] == [(0, False)]
    assert [(r.queue_offset, r.duplicate) for r in again.results] == [(0, True)]
    commit = broker_pb2.CommitOffsetRequest(
        consumer_group="g", offsets=[broker_pb2.QueueOffset(topic="T", queue_id=1, offset=1)]
    )
    call(client, DataMethod.COMMIT_OFFSET, commit)
    got = broker_pb2.QueryOffsetResponse.FromString(
        call(
            client,
            DataMethod.QUERY_OFFSET,
            broker_pb2.QueryOffsetRequest(consumer_group="g", topic="T", queue_id=1),
        )
    )
    assert got.offset == 1
    with pytest.raises(InvalidArgumentError, match="SendMessageRequest"):
        client.call_threadsafe(DataMethod.SEND_MESSAGE, b"\xff\xff\xff", 5).result(6)
    with pytest.raises(OffsetOutOfRangeError):
        call(client, DataMethod.PULL_MESSAGE, pull_req("T", 1, 50, 0))
    call(
        client,
        DataMethod.HEARTBEAT,
        broker_pb2.HeartbeatRequest(consumer_group="g", client_id="c1", topics=["T"]),
    )
    with node.consumers_lock:
        assert node.consumers.members("g", time.monotonic_ns() // 1_000_000) == ["c1"]


def test_data_listen_setting(tmp_path: Path) -> None:
    from tests.broker.test_node_decisions import settings

    assert settings(tmp_path).data_bind == ("127.0.0.1", 0)  # the gRPC host, any port
    assert settings(tmp_path, data_listen="0.0.0.0:7100").data_bind == ("0.0.0.0", 7100)
    assert settings(tmp_path, data_listen="off").data_bind is None
    for bad in ("7100", "host:", "host:70000"):
        with pytest.raises(ValueError, match="data_listen"):
            settings(tmp_path, data_listen=bad)
    with pytest.raises(ValueError, match="data_max_frame_bytes"):
        settings(tmp_path, data_max_frame_bytes=100)


def test_a_request_submits_its_chunks_at_once_and_each_keeps_its_own_error(
    tmp_path: Path,
) -> None:
    # replicate_each_async hands a request's chunks to the log in one call (submit_to); a
    # chunk the log refuses (too large) is answered alone, the others commit in order.
    node = make_node(tmp_path, MemoryLog(ME_RAFT, max_entry_bytes=1 << 10))

    async def each(payloads: list[bytes]) -> list[ChunkOutcome | RaftMQError]:
        waker = LoopWaker(asyncio.get_running_loop())
        return await node.replicate_each_async(payloads, 5.0, waker)

    try:
        ok, big = b"\x02small", b"\x02" + b"x" * 2048
        first_index = node.rlog.status().last_index + 1
        out = asyncio.run(each([ok, big, ok]))
        assert isinstance(out[1], MessageTooLargeError) and "at most 1024" in str(out[1])
        assert not isinstance(out[0], RaftMQError) and not isinstance(out[2], RaftMQError)
        assert node.rlog.read(first_index).chunks == (ok,)
        assert node.rlog.read(first_index + 1).chunks == (ok,)
        node.rlog.close()
        closed = asyncio.run(each([ok]))
        assert isinstance(closed[0], BrokerUnavailableError)
    finally:
        node.close()


def test_the_commits_of_one_advance_answer_each_request_its_own_results(
    tmp_path: Path,
) -> None:
    """Requests waiting on one loop get their chunks' results from the log's batches
    (submit_to): each request is answered once all of its own chunks are, with its own
    outcomes; a leadership loss answers every chunk of every waiting request with its typed
    error, and a request still waiting is not answered by another's results."""
    node = make_node(tmp_path, MemoryLog(ME_RAFT))
    log = node.rlog
    assert isinstance(log, MemoryLog)

    async def run() -> None:
        waker = LoopWaker(asyncio.get_running_loop())
        log.hold_commits()
        one = asyncio.ensure_future(node.replicate_each_async([b"\x02a", b"\x02b"], 5, waker))
        two = asyncio.ensure_future(node.replicate_each_async([b"\x02c"], 5, waker))
        await asyncio.sleep(0.05)
        assert not one.done() and not two.done()  # held: nobody answered
        log.release_commits()
        first, second = await one, await two
        assert len(first) == 2 and len(second) == 1
        assert not any(isinstance(r, RaftMQError) for r in [*first, *second])
        log.hold_commits()
        three = asyncio.ensure_future(node.replicate_each_async([b"\x02d", b"\x02e"], 5, waker))
        four = asyncio.ensure_future(node.replicate_async([b"\x02f"], 5, waker))
        await asyncio.sleep(0.05)
        log.become_follower("elsewhere:1")
        lost = await asyncio.wait_for(three, 2)
        assert [type(r) for r in lost] == [OutcomeUnknownError, OutcomeUnknownError]
        with pytest.raises(OutcomeUnknownError):
            await asyncio.wait_for(four, 2)

    try:
        asyncio.run(run())
    finally:
        node.close()


def test_a_request_split_over_two_commit_advances_waits_for_its_last_chunk() -> None:
    """A request whose chunks commit in two advances (two entries, two Readys) is answered
    after the second, with both results in place; one advance finishing two requests
    completes both with one post."""
    with LoopThread("test-commits") as io:
        waker = LoopWaker(io.loop)
        commits = _LoopCommits(waker)

        async def make() -> tuple[_Request, _Request]:
            return _Request(io.loop, 2), _Request(io.loop, 1)

        one, two = io.run(make())
        lost = NotLeaderError("me", None)
        commits.committed([((one, 0), Committed(3, 10, 0))])  # from this (the log's) thread
        time.sleep(0.05)
        assert not one.future.done()
        wakeups = waker.wakeups
        commits.committed([((one, 1), lost), ((two, 0), Committed(3, 11, 0))])

        async def both() -> None:
            await asyncio.gather(one.future, two.future)

        io.run(both(), 5)
        assert one.results == [Committed(3, 10, 0), lost] and two.results == [Committed(3, 11, 0)]
        assert waker.wakeups == wakeups + 1


def test_loop_waker_completes_a_batch_with_one_wakeup_within_its_bound() -> None:
    """set_results: the requests one commit advance finishes, posted from another thread at
    once: one wake-up, every future completed, still at most max_per_turn per loop turn."""
    with LoopThread("test-waker-batch") as io:
        waker = LoopWaker(io.loop, max_per_turn=10)
        turns = 0
        done_in: list[int] = []

        async def make() -> list[asyncio.Future[int]]:
            def tick() -> None:
                nonlocal turns
                turns += 1
                if len(done_in) < 95:
                    io.loop.call_soon(tick)

            io.loop.call_soon(tick)
            futs = [io.loop.create_future() for _ in range(95)]
            for f in futs:
                f.add_done_callback(lambda _: done_in.append(turns))
            return futs

        futs = io.run(make())
        waker.set_results(futs, 7)

        async def collect() -> list[int]:
            return list(await asyncio.gather(*futs))

        assert io.run(collect(), 5) == [7] * 95
        assert waker.wakeups == 1 and waker.completions == 95
        assert max(done_in.count(t) for t in set(done_in)) <= 10


def test_a_held_pull_with_a_tag_filter_is_woken_only_by_a_message_it_wants(
    node: BrokerNode, served: tuple[DataServer, LoopThread, FrameClient]
) -> None:
    """Issue 14: idle consumers of a busy topic (a tag the producers never send) were woken,
    re-planned and held again on every send to their queue: per send, work in the number of
    held pulls. The dispatcher's tag hashes decide before anything is woken."""
    server, _, client = served
    call(client, DataMethod.SEND_MESSAGE, send_req("B", 0, b"first"))

    def tagged(tag: str, body: bytes) -> broker_pb2.SendMessageRequest:
        return broker_pb2.SendMessageRequest(
            topic="B", queue_id=0, messages=[common_pb2.Message(body=body, tags=tag)]
        )

    req = pull_req("B", 0, 1, 8_000)
    req.filter_type = broker_pb2.TAG
    req.filter_expression = "audit"
    pulls = [
        client.call_threadsafe(DataMethod.PULL_MESSAGE, req.SerializeToString(), 15)
        for _ in range(50)
    ]
    deadline = time.monotonic() + 5
    while server.held_pulls < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.held_pulls == 50
    waker = server._waker
    assert waker is not None
    completions = waker.completions
    for i in range(20):
        call(client, DataMethod.SEND_MESSAGE, tagged("busy", b"busy-%d" % i))
    assert not any(f.done() for f in pulls)
    assert server.held_pulls == 50
    # the 20 sends' own answers only; woken and held again it was 20 x 50 more
    assert waker.completions - completions < 100, waker.completions - completions
    call(client, DataMethod.SEND_MESSAGE, tagged("audit", b"wanted"))
    for f in pulls:
        answer = broker_pb2.PullMessageResponse.FromString(f.result(5))
        assert answer.status == broker_pb2.FOUND
        assert [m.message.body for m in answer.messages] == [b"wanted"]


def test_hold_timers_end_waits_due_together_a_slice_per_loop_iteration() -> None:
    """Issue 14: a thousand held pulls timing out in the same millisecond ran a thousand
    re-plans before the loop read its sockets again; a send arriving then waited for them all."""
    loop = asyncio.new_event_loop()
    try:
        timers = HoldTimers(loop, slice_size=8)
        futs: list[asyncio.Future[bool]] = [loop.create_future() for _ in range(40)]
        for f in futs:
            timers.add(0.01, f)
        futs[0].set_result(True)  # woken before its time: skipped, not counted in a slice
        done_per_iteration: list[int] = []

        def probe() -> None:  # runs once per loop iteration, as a socket read would
            done_per_iteration.append(sum(f.done() for f in futs))
            if done_per_iteration[-1] < len(futs):
                loop.call_soon(probe)

        loop.call_soon(probe)
        loop.run_until_complete(asyncio.sleep(0.1))
        steps = [b - a for a, b in itertools.pairwise(done_per_iteration)]
        assert done_per_iteration[-1] == 40
        assert max(steps) <= 8, steps
        assert [f.result() for f in futs] == [True] + [False] * 39
        assert len(timers) == 0
    finally:
        loop.close()


def test_a_filtered_held_pull_goes_on_past_the_rows_it_saw_go_by(
    node: BrokerNode, served: tuple[DataServer, LoopThread, FrameClient]
) -> None:
    """The dispatcher's listener checked every row appended while the pull was held; when the
    hold ends the pull answers from past them (NO_NEW_MSG at the end), not from a rescan of
    them (which answers NO_MATCHED_MSG): per re-poll, no work in the rows a busy queue got."""
    server, _, client = served
    call(client, DataMethod.SEND_MESSAGE, send_req("C", 0, b"first"))
    req = pull_req("C", 0, 1, 1_000)
    req.filter_type = broker_pb2.TAG
    req.filter_expression = "audit"
    held = client.call_threadsafe(DataMethod.PULL_MESSAGE, req.SerializeToString(), 10)
    deadline = time.monotonic() + 5
    while server.held_pulls < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(5):
        busy = broker_pb2.SendMessageRequest(
            topic="C", queue_id=0, messages=[common_pb2.Message(body=b"%d" % i, tags="busy")]
        )
        call(client, DataMethod.SEND_MESSAGE, busy)
    answer = broker_pb2.PullMessageResponse.FromString(held.result(5))
    assert (answer.status, answer.next_offset) == (broker_pb2.NO_NEW_MSG, 6)


def test_a_pull_over_the_consume_quota_is_held_then_answered_empty_at_its_offset(
    tmp_path: Path,
) -> None:
    """Issue 27: with a consume quota of 1 KB/s (anonymous user, auth off), the first pull
    reads 4 KB and leaves its user owing ~3 s; the next pull (a 300 ms long poll) is held its
    whole wait and answered with nothing read, at the same offset, saying how long it was held;
    the user's bytes and held time are on /metrics."""
    from prometheus_client import generate_latest

    node = make_node(tmp_path, MemoryLog(ME_RAFT), quota_consume_bytes_per_s=1_000)
    server = DataServer(node, node.settings)
    host, _, port = server.start("127.0.0.1", 0).rpartition(":")
    io = LoopThread("test-client")
    client = FrameClient(host, int(port), loop=io.loop)
    try:
        for _ in range(4):
            call(client, DataMethod.SEND_MESSAGE, send_req("T", 0, b"x" * 1_000))
        # A pull below the queue's end reads what is indexed (a consumer's next pull reads the
        # rest); this one must read all four at once (and owe the quota ~3 s).
        indexed(node)
        first = broker_pb2.PullMessageResponse.FromString(
            call(client, DataMethod.PULL_MESSAGE, pull_req("T", 0, 0, 300))
        )
        assert len(first.messages) == 4 and first.throttle_ms == 0  # the burst: not held
        t0 = time.monotonic()
        held = broker_pb2.PullMessageResponse.FromString(
            call(client, DataMethod.PULL_MESSAGE, pull_req("T", 0, 0, 300))
        )
        assert time.monotonic() - t0 >= 0.29
        assert held.status == broker_pb2.NO_MATCHED_MSG and not held.messages
        assert (held.next_offset, held.max_offset, held.throttle_ms) == (0, 4, 300)
        text = generate_latest(node.metrics.registry).decode()
        assert 'raftmq_quota_throttled_answers_total{flow="consume",user=""} 1.0' in text, text
        assert 'raftmq_quota_throttle_seconds_total{flow="consume",user=""} 0.3' in text
        assert 'raftmq_quota_bytes_total{flow="produce",user=""}' in text  # counted, no quota
        # the gRPC service's holds (threads) are the same book's, and its gauges are here:
        # 4 calls of the user held at once (quota_max_held_calls_per_user), a 5th refused
        ends = [threading.Event() for _ in range(4)]
        holders = [
            threading.Thread(target=node.quota.hold, args=(Flow.CONSUME, "", 30_000, e))
            for e in ends
        ]
        for h in holders:
            h.start()
        deadline = time.monotonic() + 10
        while node.quota.held_threads < 4:
            assert time.monotonic() < deadline, node.quota.held_threads
            time.sleep(0.005)
        assert node.quota.hold(Flow.CONSUME, "", 30_000).refused is not None
        text = generate_latest(node.metrics.registry).decode()
        assert "raftmq_quota_held_threads 4.0" in text, text
        assert "raftmq_quota_refused_calls_total 1.0" in text
        for e in ends:
            e.set()
        for h in holders:
            h.join(10)
        assert node.quota.held_threads == 0
    finally:
        io.run(client.close())
        io.stop()
        server.stop(1.0)
        node.close()


def test_a_held_pull_on_a_follower_ends_its_gathered_round(tmp_path: Path) -> None:
    """A follower nobody reads from dispatches in rounds (here 60 s long); a pull held on it
    (a follower read) is woken as soon as an entry it wants commits, not at the round's end."""
    log = MemoryLog(ME_RAFT)
    store = MessageStore(tmp_path / "store", map_size_bytes=64 << 20)
    node = BrokerNode(
        settings(tmp_path),
        log,
        store,
        dispatcher_settings=DispatcherSettings(poll_timeout_ms=10, follower_round_ms=60_000),
    )
    node.start()
    server = DataServer(node, node.settings)
    host, _, port = server.start("127.0.0.1", 0).rpartition(":")
    io = LoopThread("test-client")
    client = FrameClient(host, int(port), loop=io.loop)
    try:
        send(node, "H", 0)
        assert node.wait_dispatched(log.committed_index, 5)
        log.become_follower(PEER_RAFT, term=2)
        req = pull_req("H", 0, 1, 8_000)
        req.allow_follower_read = True
        held = client.call_threadsafe(DataMethod.PULL_MESSAGE, req.SerializeToString(), 15)
        deadline = time.monotonic() + 5
        while server.held_pulls < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.held_pulls == 1
        t0 = time.monotonic()
        batch = ProduceBatch("H", 0, 1_000, (msg("H", b"from the leader"),), None)
        log.append([record_batch.encode(batch)])
        answer = broker_pb2.PullMessageResponse.FromString(held.result(5))
        assert [m.message.body for m in answer.messages] == [b"from the leader"]
        # Before the held pull's next re-plan (which parks it again, and that ends a round):
        # the round saw a pull held and was not gathered at all.
        assert time.monotonic() - t0 < 0.9 * LONG_POLL_SLICE_MS / 1000
        # A round already gathering when a pull parks: the pull ends it.
        log.append([record_batch.encode(batch)])
        time.sleep(0.2)
        assert node.dispatcher.dispatched_index < log.committed_index
        t0 = time.monotonic()
        req.offset = 2
        again = client.call_threadsafe(DataMethod.PULL_MESSAGE, req.SerializeToString(), 15)
        answer = broker_pb2.PullMessageResponse.FromString(again.result(5))
        assert [m.queue_offset for m in answer.messages] == [2]
        assert time.monotonic() - t0 < 2
    finally:
        io.run(client.close())
        io.stop()
        server.stop(1.0)
        node.close()
