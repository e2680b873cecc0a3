"""Transactional messages against real processes: a 3-node broker group and a NameServer, with the
transaction timeout, check interval and max checks scaled down. Commit, rollback, unknown ->
check-back -> commit / rollback, unknown forever -> moved after max checks; the sending producer
killed (another member answers); the leader SIGKILLed between the half message and the commit;
bad ends answered with typed errors that change nothing. Consumers see each committed message
once and never a half, rolled-back or moved one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer.transaction import (
    HalfMessage,
    LocalTransactionState,
    TransactionCheck,
    TransactionProducer,
)
from raftmq.client.routes import ChannelPool
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    InvalidArgumentError,
    TransactionConflictError,
    TransactionNotFoundError,
)
from raftmq.common.pb import broker_pb2, common_pb2, transaction_pb2
from raftmq.common.pb.common_pb2 import ErrorCode
from tests.harness.procs import ROOT, Cluster, Proc, start_cluster, wait_until

GROUP = "broker-a"
COMMIT = LocalTransactionState.COMMIT
ROLLBACK = LocalTransactionState.ROLLBACK
UNKNOWN = LocalTransactionState.UNKNOWN
TIMEOUT_MS = 1500
INTERVAL_MS = 700
MAX_CHECKS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("txn"),
        (GROUP,),
        namesrvs=1,
        broker_args=[
            "--transaction-timeout-ms",
            str(TIMEOUT_MS),
            "--transaction-check-interval-ms",
            str(INTERVAL_MS),
            "--transaction-max-checks",
            str(MAX_CHECKS),
        ],
    )
    try:
        wait_until(lambda: bool(leader(c)), 60, "a leader of broker-a")
        yield c
    finally:
        c.close()


def leader(c: Cluster) -> str:
    with Admin(c.namesrv) as admin:
        g = next((g for g in admin.groups() if g.broker_group == GROUP), None)
        return g.leader_address if g is not None else ""


def topic(c: Cluster, name: str, queues: int = 2) -> str:
    with Admin(c.namesrv) as admin:
        admin.create_topic(name, queues=queues)
        wait_until(lambda: admin.route(name).write_queues(), 30, f"the route of {name}")
    return name


def drain(c: Cluster, name: str, expect: int, settle_ms: int = 1500) -> list[bytes]:
    """Every message of `name` from the start: waits for `expect`, then a while longer so that
    one too many would show."""
    got: list[bytes] = []
    with PullConsumer(
        c.namesrv, f"drain-{name}-{time.monotonic_ns()}", start_from=StartFrom.EARLIEST
    ) as consumer:
        consumer.subscribe(name)
        deadline = time.monotonic() + 30
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(m.body for m in consumer.poll(300))
        end = time.monotonic() + settle_ms / 1000
        while time.monotonic() < end:
            got.extend(m.body for m in consumer.poll(300))
    return got


class Answers:
    """A checker whose answer per body is set by the test; it records every check."""

    def __init__(self, default: LocalTransactionState = UNKNOWN) -> None:
        self.default = default
        self.by_body: dict[bytes, LocalTransactionState] = {}
        self.seen: list[TransactionCheck] = []
        self.when: dict[str, float] = {}  # transaction id -> monotonic time of its first check
        self.lock = threading.Lock()

    def __call__(self, check: TransactionCheck) -> LocalTransactionState:
        with self.lock:
            self.seen.append(check)
            self.when.setdefault(check.transaction_id, time.monotonic())
            return self.by_body.get(check.message.body, self.default)

    def checks_of(self, txn_id: str) -> list[TransactionCheck]:
        with self.lock:
            return [c for c in self.seen if c.transaction_id == txn_id]


def answer(state: LocalTransactionState) -> Callable[[HalfMessage], LocalTransactionState]:
    return lambda half: state


def producer(c: Cluster, group: str, checker: Answers) -> TransactionProducer:
    return TransactionProducer(c.namesrv, group, checker, check_poll_ms=1000, group_refresh_ms=1000)


def test_commit_and_rollback_and_bad_ends(cluster: Cluster) -> None:
    t = topic(cluster, "txn-basic")
    checker = Answers()
    with producer(cluster, "pg-basic", checker) as p:
        committed = [
            p.send_in_transaction(t, b"c%d" % i, answer(COMMIT), keys=[f"k{i}"]) for i in range(5)
        ]
        rolled = [p.send_in_transaction(t, b"r%d" % i, answer(ROLLBACK)) for i in range(5)]
        assert all(r.end_error() is None for r in committed + rolled)
        assert sorted(drain(cluster, t, 5)) == [b"c%d" % i for i in range(5)]

        # Ends are idempotent: the same end again is a success and changes nothing.
        c0, r0 = committed[0], rolled[0]
        assert p.end_transaction(GROUP, c0.transaction_id, COMMIT) == "committed"
        assert p.end_transaction(GROUP, r0.transaction_id, ROLLBACK) == "rolled back"
        # Bad input: typed errors, nothing changed.
        with pytest.raises(TransactionConflictError, match="already rolled back"):
            p.end_transaction(GROUP, r0.transaction_id, COMMIT)
        with pytest.raises(TransactionConflictError, match="already committed"):
            p.end_transaction(GROUP, c0.transaction_id, ROLLBACK)
        with pytest.raises(TransactionNotFoundError, match="no transaction with id"):
            p.end_transaction(GROUP, "no-such-transaction", COMMIT)
        with pytest.raises(InvalidArgumentError, match="transaction id"):
            p.end_transaction(GROUP, "", COMMIT)
    with (
        producer(cluster, "pg-other", Answers()) as other,
        pytest.raises(InvalidArgumentError, match="belongs to producer group"),
    ):
        other.end_transaction(GROUP, c0.transaction_id, COMMIT)
    got = drain(cluster, t, 5)
    assert sorted(got) == [b"c%d" % i for i in range(5)]  # once each; no half, no rollback
    assert not checker.seen  # every transaction ended before its timeout: never checked


def test_concurrent_transactions_share_requests_each_answered_apart(cluster: Cluster) -> None:
    """Half sends and ends made by threads while one is in flight go together (SEND_HALF_MESSAGES
    / END_TRANSACTIONS); in a batch, a refused item fails alone and the others take effect."""
    t = topic(cluster, "txn-batched")
    with producer(cluster, "pg-batched", Answers()) as p:
        with ThreadPoolExecutor(16) as pool:
            results = list(
                pool.map(
                    lambda i: p.send_in_transaction(
                        t, b"b%d" % i, answer(COMMIT if i % 2 == 0 else ROLLBACK)
                    ),
                    range(96),
                )
            )
        assert p.flush()
        assert all(r.end_error() is None for r in results)
        # (the first few go alone, before the leader's data address is known)
        assert p._halves.items > p._halves.requests  # some requests carried several
        assert p._ends.items > p._ends.requests

        # One batched request with items that must fail alone.
        data = p.routes.data_address(leader(cluster))
        good = p.send_in_transaction(t, b"late", answer(UNKNOWN))
        end = transaction_pb2.EndTransactionRequest
        ends = transaction_pb2.EndTransactionsRequest(
            ends=[
                end(
                    transaction_id="no-such-txn",
                    producer_group="pg-batched",
                    resolution=transaction_pb2.COMMIT,
                    client_id=p.client_id,
                ),
                end(
                    transaction_id=good.transaction_id,
                    producer_group="pg-batched",
                    resolution=transaction_pb2.COMMIT,
                    client_id=p.client_id,
                ),
                end(
                    transaction_id=results[1].transaction_id,
                    producer_group="pg-batched",
                    resolution=transaction_pb2.COMMIT,
                    client_id=p.client_id,
                ),
                end(
                    transaction_id="",
                    producer_group="pg-batched",
                    resolution=transaction_pb2.COMMIT,
                    client_id=p.client_id,
                ),
            ]
        )
        got = p._data.call(data, DataMethod.END_TRANSACTIONS, ends, 10)
        assert isinstance(got, transaction_pb2.EndTransactionsResponse)
        codes = [
            ErrorCode.Name(r.error.code) if r.HasField("error") else r.response.state
            for r in got.results
        ]
        assert codes == [
            "TRANSACTION_NOT_FOUND",
            "committed",
            "TRANSACTION_CONFLICT",
            "INVALID_ARGUMENT",
        ], codes

        half = transaction_pb2.SendHalfMessageRequest
        msg = common_pb2.Message(body=b"h", born_timestamp_ms=1, born_host="h:1")
        halves = transaction_pb2.SendHalfMessagesRequest(
            halves=[
                half(
                    topic=t,
                    queue_id=0,
                    message=msg,
                    producer_group="pg-batched",
                    client_id=p.client_id,
                    transaction_id="half-ok",
                ),
                half(
                    topic="bad topic!",
                    queue_id=0,
                    message=msg,
                    producer_group="pg-batched",
                    client_id=p.client_id,
                    transaction_id="half-bad",
                ),
                half(
                    topic=t,
                    queue_id=0,
                    message=msg,
                    producer_group="pg-batched",
                    client_id=p.client_id,
                    transaction_id="half-ok",
                ),  # the same again
            ]
        )
        out = p._data.call(data, DataMethod.SEND_HALF_MESSAGES, halves, 10)
        assert isinstance(out, transaction_pb2.SendHalfMessagesResponse)
        first, bad, again = out.results
        assert first.response.msg_id and not first.HasField("error")
        assert ErrorCode.Name(bad.error.code) == "INVALID_NAME"
        assert again.response.duplicate  # stored once
        assert p.end_transaction(GROUP, "half-ok", ROLLBACK) == "rolled back"
    got_bodies = sorted(drain(cluster, t, 49))
    assert got_bodies == sorted([b"b%d" % i for i in range(0, 96, 2)] + [b"late"])


def test_unknown_is_checked_back_then_committed_or_rolled_back(cluster: Cluster) -> None:
    t = topic(cluster, "txn-check")
    checker = Answers()
    checker.by_body = {b"yes": COMMIT, b"no": ROLLBACK}
    with producer(cluster, "pg-check", checker) as p:
        started = time.monotonic()
        yes = p.send_in_transaction(t, b"yes", answer(UNKNOWN))
        no = p.send_in_transaction(t, b"no", answer(UNKNOWN))
        assert drain(cluster, t, 0, settle_ms=300) == []  # unknown: still invisible
        wait_until(lambda: checker.checks_of(no.transaction_id), 30, "a check of 'no'")
        wait_until(lambda: checker.checks_of(yes.transaction_id), 30, "a check of 'yes'")
        first = checker.checks_of(yes.transaction_id)[0]
        # Never before the transaction timeout; the half message as stored, real topic.
        assert time.monotonic() - started >= TIMEOUT_MS / 1000 * 0.9
        assert (first.message.topic, first.message.body) == (t, b"yes")
        assert first.check_times == 1
        assert drain(cluster, t, 1) == [b"yes"]

        def rolled_back() -> bool:
            try:
                p.end_transaction(GROUP, no.transaction_id, COMMIT)
            except TransactionConflictError:
                return True
            raise AssertionError("a commit of a transaction the checker rolled back went through")

        wait_until(rolled_back, 10, "'no' rolled back by its check")
        assert p.end_transaction(GROUP, yes.transaction_id, COMMIT) == "committed"
    assert drain(cluster, t, 1) == [b"yes"]


def test_unknown_forever_moves_after_max_checks(cluster: Cluster) -> None:
    t = topic(cluster, "txn-moved", queues=1)
    checker = Answers(default=UNKNOWN)
    with producer(cluster, "pg-moved", checker) as p:
        r = p.send_in_transaction(t, b"limbo", answer(UNKNOWN))
        deadline_s = (TIMEOUT_MS + (MAX_CHECKS + 2) * INTERVAL_MS) / 1000 + 20
        wait_until(lambda: moved_body(cluster, r.half.queue_id) == b"limbo", deadline_s, "moved")
        assert 1 <= len(checker.checks_of(r.transaction_id)) <= MAX_CHECKS
        with pytest.raises(TransactionConflictError, match="already moved"):
            p.end_transaction(GROUP, r.transaction_id, COMMIT)
        assert p.end_transaction(GROUP, r.transaction_id, ROLLBACK) == "moved"
    assert drain(cluster, t, 0, settle_ms=500) == []
    _, procs = cluster.groups[GROUP]
    assert any("broker.transaction_moved" in p.log.read_text() for p in procs)


def moved_body(c: Cluster, queue_id: int) -> bytes | None:
    pool = ChannelPool()
    try:
        req = broker_pb2.PullMessageRequest(
            consumer_group="inspect",
            topic="TRANS_CHECK_MAX_TIME_TOPIC",
            queue_id=queue_id,
            offset=0,
            max_count=10,
        )
        resp = pool.broker(leader(c)).PullMessage(req, timeout=5)
        return resp.messages[-1].message.body if resp.messages else None
    except Exception:
        return None
    finally:
        pool.close()


SENDER = """
import sys, time
from raftmq.client.producer.transaction import LocalTransactionState, TransactionProducer
p = TransactionProducer(sys.argv[1], sys.argv[2], lambda check: LocalTransactionState.UNKNOWN,
                        check_poll_ms=1000, group_refresh_ms=1000)
r = p.send_in_transaction(sys.argv[3], b"orphan", lambda half: LocalTransactionState.UNKNOWN)
print(r.transaction_id, flush=True)
time.sleep(600)
"""


def test_sender_killed_another_member_answers(cluster: Cluster, tmp_path: Path) -> None:
    t = topic(cluster, "txn-orphan")
    survivor = Answers(default=COMMIT)
    with producer(cluster, "pg-orphan", survivor):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
        env["PYTHONPATH"] = str(ROOT)
        sender = subprocess.Popen(
            [sys.executable, "-c", SENDER, cluster.namesrv, "pg-orphan", t],
            stdout=subprocess.PIPE,
            stderr=(tmp_path / "sender.log").open("w"),
            text=True,
            env=env,
        )
        try:
            assert sender.stdout is not None
            txn_id = sender.stdout.readline().strip()
            assert txn_id, (tmp_path / "sender.log").read_text()
        finally:
            sender.send_signal(signal.SIGKILL)
            sender.wait(10)
        wait_until(lambda: survivor.checks_of(txn_id), 30, "the other member's check")
        assert drain(cluster, t, 1) == [b"orphan"]


def test_leader_killed_between_half_and_commit(cluster: Cluster) -> None:
    t = topic(cluster, "txn-failover")
    checker = Answers()
    checker.by_body = {b"checked": COMMIT}
    layout, procs = cluster.groups[GROUP]
    killed: list[Proc] = []

    def kill_leader(half: HalfMessage) -> LocalTransactionState:
        address = leader(cluster)
        victim = next(procs[i] for i in range(3) if layout.address(i) == address)
        victim.kill(signal.SIGKILL)
        killed.append(victim)
        return COMMIT

    with producer(cluster, "pg-failover", checker) as p:
        # For the new leader to check; its check immunity (4 s) leaves time to elect it.
        sent_at = time.monotonic()
        pending = p.send_in_transaction(t, b"checked", answer(UNKNOWN), check_immunity_ms=4000)
        r = p.send_in_transaction(t, b"survives", kill_leader)
        assert killed, "the local transaction did not run"
        assert r.end_error() is None, r.end_error()
        assert p.end_transaction(GROUP, r.transaction_id, COMMIT) == "committed"
        # The new leader continues the check schedule of the half sent to the old one.
        wait_until(lambda: checker.checks_of(pending.transaction_id), 40, "check by new leader")
        assert checker.when[pending.transaction_id] - sent_at >= 3.6  # not before its immunity
        got = drain(cluster, t, 2)
    assert sorted(got) == [b"checked", b"survives"]

    # The killed node restarts with its table from lmdb and catches up from the log; as leader
    # it knows both ends (a commit again is a success, a rollback a conflict).
    victim = killed[0]
    victim.start("broker.started")
    node_id = f"n{procs.index(victim)}"
    with Admin(cluster.namesrv) as admin:

        def elected() -> bool:
            try:
                return admin.elect(GROUP, node_id) == node_id
            except Exception:
                return False

        wait_until(elected, 60, f"{node_id} leading again")
    with producer(cluster, "pg-failover", checker) as p:
        assert p.end_transaction(GROUP, r.transaction_id, COMMIT) == "committed"
        with pytest.raises(TransactionConflictError):
            p.end_transaction(GROUP, pending.transaction_id, ROLLBACK)
    assert sorted(drain(cluster, t, 2)) == [b"checked", b"survives"]
