"""ProducerChecks, the leader's table of live transactional producers and their waiting checks:
a held poll keeps a client live, a check wakes its poll, idle clients expire, queues are bounded."""

from __future__ import annotations

import threading
import time

from raftmq.broker.transactions_shell import MAX_PENDING_PER_CLIENT, ProducerChecks
from raftmq.common.pb import transaction_pb2


def check(txn_id: str) -> transaction_pb2.TransactionCheck:
    return transaction_pb2.TransactionCheck(transaction_id=txn_id, producer_group="pg")


def test_a_check_wakes_the_clients_poll_and_only_that_clients() -> None:
    checks = ProducerChecks(expiry_s=5)
    now = time.monotonic()
    assert checks.seen("pg", "a", now)
    assert not checks.seen("pg", "a", now)
    checks.seen("pg", "b", now)
    got: list[list[str]] = []

    def poll() -> None:
        answer = checks.wait("pg", "a", time.monotonic() + 10, 8)
        got.append([c.transaction_id for c in answer])

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.1)
    started = time.monotonic()
    checks.push("pg", "a", check("t1"))
    t.join(5)
    assert got == [["t1"]] and time.monotonic() - started < 2
    assert checks.wait("pg", "b", time.monotonic() + 0.05, 8) == []
    checks.push("pg", "gone", check("t2"))  # an unknown client: dropped, nothing raised


def test_idle_clients_expire_but_a_client_holding_a_poll_does_not() -> None:
    checks = ProducerChecks(expiry_s=0.2)
    checks.seen("pg", "idle", time.monotonic())
    checks.seen("pg", "waiting", time.monotonic())
    t = threading.Thread(target=lambda: checks.wait("pg", "waiting", time.monotonic() + 1.0, 8))
    t.start()
    time.sleep(0.5)
    assert checks.expire(time.monotonic()) == [("pg", "idle")]
    t.join(5)
    assert checks.expire(time.monotonic() + 1) == [("pg", "waiting")]


def test_waiting_checks_are_bounded_and_polled_in_order() -> None:
    checks = ProducerChecks(expiry_s=5)
    checks.seen("pg", "a", time.monotonic())
    for i in range(MAX_PENDING_PER_CLIENT + 10):
        checks.push("pg", "a", check(f"t{i}"))
    first = checks.wait("pg", "a", time.monotonic(), 3)
    assert [c.transaction_id for c in first] == ["t10", "t11", "t12"]  # the oldest dropped
