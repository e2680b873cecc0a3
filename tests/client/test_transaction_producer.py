"""TransactionProducer's argument checks: each bad argument a typed error that names it, raised
before anything is sent (the NameServer here is unreachable on purpose)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftmq.client.producer.transaction import LocalTransactionState, TransactionProducer
from raftmq.common.errors import InvalidArgumentError

NOWHERE = "127.0.0.1:1"


def commit(_: object) -> LocalTransactionState:
    return LocalTransactionState.COMMIT


@pytest.fixture
def producer() -> Iterator[TransactionProducer]:
    p = TransactionProducer(NOWHERE, "pg", commit, group_refresh_ms=60_000)
    try:
        yield p
    finally:
        p.close()


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"producer_group": "%RETRY%pg"}, "reserved prefix"),
        ({"producer_group": ""}, "group"),
        ({"checker": "not callable"}, "checker"),
        ({"check_poll_ms": 0}, "check_poll_ms"),
        ({"end_timeout_ms": -1}, "end_timeout_ms"),
    ],
)
def test_bad_construction_is_refused(kwargs: dict[str, object], names: str) -> None:
    args: dict[str, object] = {"producer_group": "pg", "checker": commit, **kwargs}
    with pytest.raises(InvalidArgumentError, match=names):
        TransactionProducer(NOWHERE, **args)  # type: ignore[arg-type]


def test_bad_sends_and_ends_are_refused_before_sending(producer: TransactionProducer) -> None:
    with pytest.raises(InvalidArgumentError, match="topic"):
        producer.send_in_transaction("bad topic!", b"x", commit)
    with pytest.raises(InvalidArgumentError, match="system topic"):
        producer.send_in_transaction("TRANS_CHECK_MAX_TIME_TOPIC", b"x", commit)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        producer.send_in_transaction("t", "text", commit)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="local_transaction"):
        producer.send_in_transaction("t", b"x", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="one string"):
        producer.send_in_transaction("t", b"x", commit, keys="k")
    with pytest.raises(InvalidArgumentError, match="check_immunity_ms"):
        producer.send_in_transaction("t", b"x", commit, check_immunity_ms=-1)
    with pytest.raises(InvalidArgumentError, match="LocalTransactionState"):
        producer.end_transaction("broker-a", "id", "commit")  # type: ignore[arg-type]


def test_a_closed_producer_refuses_sends(producer: TransactionProducer) -> None:
    producer.close()
    producer.close()  # idempotent
    with pytest.raises(InvalidArgumentError, match="closed"):
        producer.send_in_transaction("t", b"x", commit)
