"""BrokerNode's decisions with no sockets and no processes: a MemoryLog (raftlog/memory.py) as
the CommitLog, real lmdb stores in tmp_path and the real dispatcher thread.

Send validation, auto-create, queue choice, idempotent retries, NOT_LEADER, pull answers,
offsets, queries, and the leader gate (a readiness latch per leader term)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from raftmq.broker.commit_log import CommitLog
from raftmq.broker.dispatch import Dispatcher, PendingState
from raftmq.broker.dispatcher_thread import DispatcherSettings
from raftmq.broker.errors import DispatcherStoppedError, OffsetDisagreementError
from raftmq.broker.node import BrokerNode
from raftmq.broker.produce import SendOutcome
from raftmq.broker.pull import PullResult, PullStatus
from raftmq.broker.settings import BrokerSettings
from raftmq.broker.store import MessageStore
from raftmq.broker.wakeups import LoopWaker
from raftmq.common import record_batch, stored_batch
from raftmq.common.errors import (
    InvalidArgumentError,
    InvalidNameError,
    MessageNotFoundError,
    MessageTooLargeError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RaftMQError,
    TopicNotFoundError,
)
from raftmq.common.message import Message, decode_msg_id
from raftmq.common.record_batch import ProduceBatch, ProducerSequence, TopicConfigChange, TopicOp
from raftmq.common.topic_config import TopicConfig
from raftmq.raftlog.memory import MemoryLog

MEMBERS = (
    "n0=127.0.0.1:10911/127.0.0.1:20911,"
    "n1=127.0.0.1:10912/127.0.0.1:20912,"
    "n2=127.0.0.1:10913/127.0.0.1:20913"
)
ME_RAFT, PEER_RAFT, PEER_ADDRESS = "127.0.0.1:20911", "127.0.0.1:20912", "127.0.0.1:10912"
FAST = DispatcherSettings(poll_timeout_ms=10)


def settings(data_dir: Path, **overrides: Any) -> BrokerSettings:
    values: dict[str, Any] = {
        "node_id": "n0",
        "members": MEMBERS,
        "data_dir": data_dir,
        "default_queue_nums": 4,
        "max_message_bytes": 1024,
        "max_batch_messages": 8,
        "send_timeout_ms": 5_000,
        "long_poll_max_ms": 5_000,
        "store_map_size_bytes": 64 << 20,
    }
    values.update(overrides)
    return BrokerSettings(**values)


def make_node(data_dir: Path, log: CommitLog, **overrides: Any) -> BrokerNode:
    store = MessageStore(data_dir / "store", map_size_bytes=64 << 20)
    node = BrokerNode(
        settings(data_dir, **overrides),
        log,
        store,
        leader_ready_wait_s=0.5,
        dispatcher_settings=FAST,
    )
    node.start()
    return node


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog(ME_RAFT)


@pytest.fixture
def node(tmp_path: Path, log: MemoryLog) -> Iterator[BrokerNode]:
    n = make_node(tmp_path, log)
    yield n
    n.close()


def msg(topic: str, body: bytes = b"hello", keys: tuple[str, ...] = ()) -> Message:
    return Message(topic, body, "tagA", keys, {}, 0, 1_700_000_000_000, "127.0.0.1:1")


def send(
    node: BrokerNode,
    topic: str,
    queue_id: int = 0,
    n: int = 1,
    *,
    producer: tuple[str, int] = ("", 0),
    keys: tuple[str, ...] = (),
) -> tuple[int, list[SendOutcome]]:
    messages = [msg(topic, b"m%d" % i, keys) for i in range(n)]
    return node.sends.send(topic, queue_id, messages, producer[0], producer[1], 0)


def pull(node: BrokerNode, topic: str, queue_id: int, offset: int, **kw: Any) -> PullResult:
    args: dict[str, Any] = {
        "sql": False,
        "expression": "*",
        "max_wait_ms": 0,
        "allow_follower_read": False,
        "max_bytes": 0,
        "deadline": time.monotonic() + 10,
    }
    args.update(kw)
    return node.pulls.pull("g", topic, queue_id, offset, 32, **args)


def indexed(node: BrokerNode) -> None:
    """A send is answered at its commit (issue 29) and indexed after: a test that reads the
    index (bounds, keys, times) waits for it first, as a client of these queries would."""
    assert node.wait_dispatched(node.rlog.committed_index, 5)


# ---- send ---------------------------------------------------------------------------------------


def test_send_validation_refuses_before_replicating(node: BrokerNode, log: MemoryLog) -> None:
    before = log.committed_index
    with pytest.raises(InvalidArgumentError, match="at least one message"):
        node.sends.send("T", 0, [], "", 0, 0)
    with pytest.raises(InvalidArgumentError, match="max_batch_messages"):
        send(node, "T", 0, 9)
    with pytest.raises(MessageTooLargeError):
        node.sends.send("T", 0, [msg("T", b"x" * 1025)], "", 0, 0)
    with pytest.raises(InvalidNameError):
        send(node, "bad topic!")
    with pytest.raises(InvalidNameError):
        send(node, "")
    with pytest.raises(InvalidArgumentError, match="negative"):
        send(node, "T", 0, producer=("p1", -1))
    with pytest.raises(InvalidNameError):
        send(node, "T", 0, producer=(" p1", 0))
    assert log.committed_index == before  # nothing reached the log
    with pytest.raises(InvalidArgumentError, match="must name its queue"):
        send(node, "T", -1, producer=("p1", 0))
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        send(node, "T", 4)


def test_a_send_auto_creates_its_topic(node: BrokerNode) -> None:
    assert node.topic("Auto") is None
    queue_id, outcomes = send(node, "Auto", 2)
    assert queue_id == 2 and [o.queue_offset for o in outcomes] == [0]
    assert node.topic("Auto") == TopicConfig("Auto", 4, 4, auto_created=True)


def test_without_auto_create_an_unknown_topic_is_refused(tmp_path: Path, log: MemoryLog) -> None:
    n = make_node(tmp_path, log, auto_create_topic=False)
    try:
        with pytest.raises(TopicNotFoundError):
            send(n, "Unknown")
        n.topic_admin.create_topic(TopicConfig("Known", 2, 2))
        assert send(n, "Known", 1)[0] == 1
    finally:
        n.close()


def test_the_broker_picks_queues_round_robin(node: BrokerNode) -> None:
    chosen = [send(node, "RR", -1)[0] for _ in range(8)]
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert chosen[:4] != chosen[1:5]  # it moves on each time
    _, outcomes = send(node, "RR", 3, 3)
    assert [o.queue_offset for o in outcomes] == [2, 3, 4]


def test_an_idempotent_retry_gets_the_original_answer(node: BrokerNode) -> None:
    _, first = send(node, "Idem", 1, 2, producer=("p1", 0))
    _, again = send(node, "Idem", 1, 2, producer=("p1", 0))
    assert [o.duplicate for o in first] == [False, False]
    assert [o.duplicate for o in again] == [True, True]
    originals = [(o.msg_id, o.queue_offset) for o in first]
    assert [(o.msg_id, o.queue_offset) for o in again] == originals
    _, nxt = send(node, "Idem", 1, 1, producer=("p1", 2))
    assert nxt[0].queue_offset == 2 and not nxt[0].duplicate
    indexed(node)
    assert node.store.queue_bounds("Idem", 1) == (0, 3)  # stored once


def test_a_follower_answers_not_leader_with_the_leaders_address(
    node: BrokerNode, log: MemoryLog
) -> None:
    send(node, "F", 0, 2)
    log.become_follower(PEER_RAFT, term=2)
    with pytest.raises(NotLeaderError) as info:
        send(node, "F", 0)
    assert info.value.leader_hint == PEER_ADDRESS
    with pytest.raises(NotLeaderError):
        node.offsets.commit_offsets("g", [("F", 0, 1)])
    with pytest.raises(NotLeaderError):
        pull(node, "F", 0, 0)
    assert len(pull(node, "F", 0, 0, allow_follower_read=True).messages) == 2
    log.become_follower(None)
    with pytest.raises(NotLeaderError) as unknown:
        send(node, "F", 0)
    assert unknown.value.leader_hint == ""


def test_the_leader_places_offsets_and_answers_at_commit(node: BrokerNode, log: MemoryLog) -> None:
    """The batch in the log carries the offsets the send was answered with (state 2), and the
    answer came before the index held it when the index was held back."""
    _, first = send(node, "A", 1, 2)
    indexed(node)
    with _held(node):
        _, second = send(node, "A", 1, 3)  # answered while dispatch cannot run
        assert node.store.queue_bounds("A", 1) == (0, 2)
    assert [o.queue_offset for o in first + second] == [0, 1, 2, 3, 4]
    entry = log.read(log.committed_index)
    assert stored_batch.placed_offset(entry.chunks[0]) == 2
    assert node.leader_offsets.placed_batches >= 2
    indexed(node)
    assert node.store.queue_bounds("A", 1) == (0, 5)


class _held:
    """Holds the dispatcher between two steps (its step lock) for the with block."""

    def __init__(self, node: BrokerNode) -> None:
        self._lock = node.dispatcher._step_lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_forged_placed_offset_stops_a_follower_loudly(
    node: BrokerNode, log: MemoryLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower applies what its leader committed; a batch whose placed offset is not what
    its own count gives stops its dispatch with a typed error, logged with the topic, the
    queue, both offsets and the entry, rather than index the queue differently."""
    log.become_follower(PEER_RAFT, term=2)
    good = bytearray(
        stored_batch.encode_batch("F", 0, [msg("F", b"a"), msg("F", b"b")], None, "127.0.0.1:1")
    )
    stored_batch.stamp(good, 0, 1_000)
    stored_batch.place_offset(good, 0)
    forged = bytearray(stored_batch.encode_batch("F", 0, [msg("F", b"c")], None, "127.0.0.1:1"))
    stored_batch.stamp(forged, 0, 1_001)
    stored_batch.place_offset(forged, 7)  # the queue holds 2
    log.append([bytes(good)])
    bad = log.append([bytes(forged)])
    with pytest.raises(DispatcherStoppedError):
        node.dispatcher.wait_dispatched(bad.index, 5)
    failure = node.dispatcher.failure
    assert isinstance(failure, OffsetDisagreementError)
    assert (failure.topic, failure.queue_id, failure.placed, failure.counted) == ("F", 0, 7, 2)
    assert failure.raft_index == bad.index
    # Nothing of the forged entry indexed (the good one may share its aborted transaction).
    assert node.dispatcher.dispatched_index < bad.index
    assert node.store.queue_bounds("F", 0)[1] <= 2
    line = next(r for r in caplog.records if "broker.offset_disagreement" in r.getMessage())
    assert line.levelname == "CRITICAL"
    assert f"topic=F queue=0 placed=7 counted=2 index={bad.index}" in line.getMessage()
    with pytest.raises(RaftMQError):  # reads that need the index get a typed error
        pull(node, "F", 0, 2, allow_follower_read=True)


# ---- pull ---------------------------------------------------------------------------------------


def test_pull_answers(node: BrokerNode) -> None:
    _, sent = send(node, "P", 0, 3)
    found = pull(node, "P", 0, 1)
    assert found.status == PullStatus.FOUND
    assert [m.queue_offset for m in found.messages] == [1, 2]
    assert [m.msg_id for m in found.messages] == [o.msg_id for o in sent[1:]]
    assert (found.next_offset, found.min_offset, found.max_offset) == (3, 0, 3)
    t0 = time.monotonic()
    empty = pull(node, "P", 0, 3, max_wait_ms=100)
    assert empty.status == PullStatus.NO_NEW_MSG and empty.next_offset == 3
    assert time.monotonic() - t0 >= 0.09  # held for its wait
    with pytest.raises(OffsetOutOfRangeError) as info:
        pull(node, "P", 0, 7)
    assert (info.value.min_offset, info.value.max_offset) == (0, 3)
    unmatched = pull(node, "P", 0, 0, expression="tagB")
    assert unmatched.status == PullStatus.NO_MATCHED_MSG and unmatched.next_offset == 3
    with pytest.raises(InvalidArgumentError):
        pull(node, "P", 0, 0, sql=True, expression="a >")
    with pytest.raises(TopicNotFoundError):
        pull(node, "Nope", 0, 0)


def test_a_long_poll_answers_when_a_message_arrives(node: BrokerNode) -> None:
    send(node, "LP", 0)
    with ThreadPoolExecutor(1) as pool:
        held: Future[PullResult] = pool.submit(pull, node, "LP", 0, 1, max_wait_ms=5_000)
        time.sleep(0.1)
        assert not held.done()
        t0 = time.monotonic()
        send(node, "LP", 0)
        result = held.result(5)
    assert result.status == PullStatus.FOUND and result.messages[0].queue_offset == 1
    assert time.monotonic() - t0 < 2


def _dispatch_by_hand(store: MessageStore, log: MemoryLog, upto: int) -> None:
    state = PendingState(store)
    outs = []
    for entry in log.read_from(1, max_bytes=1 << 30, max_entries=upto):
        out = Dispatcher().apply(entry, state)
        state.absorb(out)
        outs.append(out)
    store.apply(outs)


def test_a_pull_past_the_end_waits_for_indexing_before_out_of_range(
    node: BrokerNode, log: MemoryLog, tmp_path: Path
) -> None:
    # Another node of the group, still indexing: it knows the topic but not its messages yet.
    node.topic_admin.create_topic(TopicConfig("Lag", 1, 1))
    topic_index = log.committed_index
    send(node, "Lag", 0, 3)
    store = MessageStore(tmp_path / "b" / "store", map_size_bytes=64 << 20)
    _dispatch_by_hand(store, log, topic_index)
    assert store.queue_bounds("Lag", 0) == (0, 0)
    lagging = BrokerNode(settings(tmp_path / "b"), log, store, dispatcher_settings=FAST)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(pull, lagging, "Lag", 0, 2, allow_follower_read=True)
            time.sleep(0.1)
            assert not held.done()  # past its end, but committed entries are unindexed
            lagging.start()
            result = held.result(5)
        assert result.status == PullStatus.FOUND
        assert [m.queue_offset for m in result.messages] == [2]
    finally:
        lagging.close()


# ---- offsets and queries ------------------------------------------------------------------------


def test_offsets_commit_query_and_reset(node: BrokerNode) -> None:
    node.topic_admin.create_topic(TopicConfig("O", 2, 2))
    assert node.offsets.query_offset("g", "O", 0) == -1
    node.offsets.commit_offsets("g", [("O", 0, 5), ("O", 1, 2)])
    assert node.offsets.query_offset("g", "O", 0) == 5
    assert node.offsets.query_offset("g", "O", 1) == 2
    with pytest.raises(InvalidArgumentError):
        node.offsets.commit_offsets("g", [("O", -1, 0)])
    send(node, "O", 0, 2)
    time.sleep(0.005)
    middle_ms = time.time_ns() // 1_000_000
    time.sleep(0.005)
    send(node, "O", 0, 3)
    indexed(node)
    info = node.offsets.queue_info("O", 0)
    assert (info.min_offset, info.max_offset) == (0, 5)
    assert info.min_store_timestamp_ms < middle_ms < info.max_store_timestamp_ms
    assert node.offsets.offset_for_timestamp("O", 0, middle_ms) == 2
    assert node.offsets.reset_offsets_to_timestamp("g", "O", middle_ms) == {0: 2, 1: 0}
    assert node.offsets.query_offset("g", "O", 0) == 2


def test_query_by_id_and_by_key(node: BrokerNode) -> None:
    _, outcomes = send(node, "Q", 1, 2, keys=("order-7",))
    send(node, "Q", 2, 1, keys=("order-8",))
    found = node.queries.message_by_id(outcomes[1].msg_id)  # waits for its index
    assert (found.queue_id, found.queue_offset, found.message.body) == (1, 1, b"m1")
    indexed(node)  # the key index too
    by_key = node.queries.messages_by_key("Q", "order-7", 10, 0, 0)
    assert sorted(m.msg_id for m in by_key) == sorted(o.msg_id for o in outcomes)
    assert node.queries.messages_by_key("Q", "nothing", 10, 0, 0) == []
    mid = decode_msg_id(outcomes[0].msg_id)
    assert mid.broker_group == node.group
    with pytest.raises(MessageNotFoundError):
        node.queries.message_by_id(outcomes[0].msg_id.replace(node.group, "broker-z"))
    with pytest.raises(InvalidArgumentError):
        node.queries.messages_by_key("Q", "", 10, 0, 0)


# ---- the leader gate ----------------------------------------------------------------------------


def test_the_gate_waits_once_per_term(node: BrokerNode, log: MemoryLog) -> None:
    for _ in range(5):
        send(node, "G", 0)
    node.offsets.commit_offsets("g", [("G", 0, 1)])
    assert node.leader_gate_waits == 1  # the first write of term 1 only
    log.become_follower(PEER_RAFT, term=2)
    log.become_leader()
    for _ in range(3):
        send(node, "G", 0)
    assert node.leader_gate_waits == 2


def test_a_new_leader_answers_only_after_applying_earlier_terms(
    node: BrokerNode, log: MemoryLog
) -> None:
    node.topic_admin.create_topic(TopicConfig("S", 2, 2))
    _, original = send(node, "S", 0, 1, producer=("p1", 0))
    # Term 2 belongs to another leader: it widens the topic and stores p1's next send.
    log.become_follower(PEER_RAFT, term=2)
    log.hold_commits()  # this node has not applied them yet
    log.append([record_batch.encode(TopicConfigChange(TopicOp.UPDATE, TopicConfig("S", 8, 8)))])
    later = ProduceBatch("S", 0, 1_000, (msg("S", b"by n1"),), ProducerSequence("p1", 1))
    log.append([record_batch.encode(later)])
    log.become_leader()  # term 3: its no-op waits behind them
    with ThreadPoolExecutor(2) as pool:
        widened = pool.submit(send, node, "S", 5)  # queue 5 exists only since term 2
        retried = pool.submit(send, node, "S", 0, 1, producer=("p1", 1))
        time.sleep(0.2)
        assert not widened.done() and not retried.done()  # held by the gate, not refused
        log.release_commits()
        assert widened.result(5)[0] == 5
        _, again = retried.result(5)
    assert again[0].duplicate and again[0].queue_offset == 1  # the term-2 original
    assert node.topic("S") == TopicConfig("S", 8, 8)
    assert original[0].queue_offset == 0


def test_the_gate_gives_up_as_not_leader(node: BrokerNode, log: MemoryLog) -> None:
    send(node, "T", 0)
    log.become_follower(PEER_RAFT, term=2)
    log.hold_commits()
    log.become_leader()  # its no-op never commits
    t0 = time.monotonic()
    with pytest.raises(NotLeaderError):
        send(node, "T", 0)
    assert 0.4 <= time.monotonic() - t0 < 3
    log.release_commits()
    assert send(node, "T", 0)[1][0].queue_offset == 1


def test_a_deposed_leader_stops_waiting_at_the_gate(node: BrokerNode, log: MemoryLog) -> None:
    send(node, "T", 0)
    log.become_follower(PEER_RAFT, term=2)
    log.hold_commits()
    log.become_leader()
    done = threading.Event()

    def depose() -> None:
        time.sleep(0.1)
        log.become_follower(PEER_RAFT, term=4)
        done.set()

    threading.Thread(target=depose).start()
    with pytest.raises(NotLeaderError) as info:
        send(node, "T", 0)
    assert done.is_set() and info.value.leader_hint == PEER_ADDRESS


# ---- a leader's gathered dispatch rounds --------------------------------------------------------

LEADER_GATHERING = DispatcherSettings(poll_timeout_ms=10, leader_round_ms=60_000)


@pytest.fixture
def gathering_leader(tmp_path: Path, log: MemoryLog) -> Iterator[BrokerNode]:
    store = MessageStore(tmp_path / "store", map_size_bytes=64 << 20)
    n = BrokerNode(
        settings(tmp_path),
        log,
        store,
        leader_ready_wait_s=0.5,
        dispatcher_settings=LEADER_GATHERING,
    )
    n.start()
    yield n
    n.close()


def test_a_leader_gathers_behind_placed_sends_and_a_request_waiting_for_its_outcome_ends_the_round(
    gathering_leader: BrokerNode, log: MemoryLog
) -> None:
    """A send whose offsets the leader placed is answered at its commit, so the leader indexes
    it in a round (60 s here); a write answered once indexed (a topic, an offset commit: a
    thread in OutcomeBook.wait, or a data loop's callback) ends the round at once."""
    n = gathering_leader
    t0 = time.monotonic()
    n.topic_admin.create_topic(TopicConfig("L", 2, 2))  # waits for its dispatched outcome
    assert time.monotonic() - t0 < 2
    _, sent = send(n, "L", 0, 2)  # answered at its commit, the index behind it
    time.sleep(0.2)
    assert [o.queue_offset for o in sent] == [0, 1]
    assert n.dispatcher.dispatched_index < log.committed_index
    assert n.dispatcher.rounds_gathered >= 1
    t0 = time.monotonic()
    n.offsets.commit_offsets("g", [("L", 0, 2)])
    assert time.monotonic() - t0 < 2
    assert n.dispatcher.dispatched_index == log.committed_index
    send(n, "L", 1)
    time.sleep(0.2)
    change = record_batch.encode(TopicConfigChange(TopicOp.UPDATE, TopicConfig("L", 4, 4)))

    async def on_a_loop() -> None:  # the data server's way: a callback, no thread waits
        waker = LoopWaker(asyncio.get_running_loop())
        await n.replicate_async([change], 5, waker)

    t0 = time.monotonic()
    asyncio.run(on_a_loop())
    assert time.monotonic() - t0 < 2
    assert n.topic("L") == TopicConfig("L", 4, 4)


# ---- a follower's gathered dispatch rounds ------------------------------------------------------

# A round far longer than any test: whatever indexes a gathered round sooner is what ends it.
GATHERING = DispatcherSettings(poll_timeout_ms=10, follower_round_ms=60_000)


@pytest.fixture
def follower(tmp_path: Path, log: MemoryLog) -> Iterator[BrokerNode]:
    store = MessageStore(tmp_path / "store", map_size_bytes=64 << 20)
    n = BrokerNode(
        settings(tmp_path), log, store, leader_ready_wait_s=0.5, dispatcher_settings=GATHERING
    )
    n.start()
    n.topic_admin.create_topic(TopicConfig("R", 2, 2))
    indexed(n)
    log.become_follower(PEER_RAFT, term=2)
    yield n
    n.close()


def _from_the_leader(log: MemoryLog, n: int, queue_id: int = 0) -> int:
    """`n` one-message entries committed by the other leader; the last one's index."""
    for i in range(n):
        batch = ProduceBatch("R", queue_id, 1_000, (msg("R", b"r%d" % i),), None)
        last = log.append([record_batch.encode(batch)])
    return last.index


def test_a_follower_gathers_entries_and_a_follower_read_ends_the_round(
    follower: BrokerNode, log: MemoryLog
) -> None:
    """No send waits on a follower's index, so it dispatches in rounds; a pull that needs the
    entries of the round (past the queue's end here, or at its end) gets them at once."""
    last = _from_the_leader(log, 3)
    time.sleep(0.2)
    assert follower.dispatcher.dispatched_index < last  # gathered, not indexed one by one
    assert follower.dispatcher.rounds_gathered >= 1
    t0 = time.monotonic()
    found = pull(follower, "R", 0, 1, allow_follower_read=True)  # past the end it knows
    assert [m.queue_offset for m in found.messages] == [1, 2]
    assert time.monotonic() - t0 < 2
    with ThreadPoolExecutor(1) as pool:  # a long poll at the end: entries come at once
        held = pool.submit(pull, follower, "R", 0, 3, allow_follower_read=True, max_wait_ms=5_000)
        time.sleep(0.1)
        t0 = time.monotonic()
        _from_the_leader(log, 1)
        assert [m.queue_offset for m in held.result(5).messages] == [3]
    assert time.monotonic() - t0 < 2


def test_a_follower_elected_leader_indexes_its_gathered_round_at_once(
    follower: BrokerNode, log: MemoryLog
) -> None:
    """Elected, its latch waits for its index: the round ends at the election, not after it."""
    last = _from_the_leader(log, 3)
    time.sleep(0.2)
    assert follower.dispatcher.dispatched_index < last
    log.become_leader()
    deadline = time.monotonic() + 2
    while follower.dispatcher.dispatched_index < log.committed_index:
        assert time.monotonic() < deadline, "the election did not end the gathered round"
        time.sleep(0.01)
    _, sent = send(follower, "R", 0)  # the latch (0.5 s here) is open at once
    assert sent[0].queue_offset == 3
