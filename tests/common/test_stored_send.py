"""The SEND_STORED frame codec (common/stored_send.py): requests and answers round-trip, and
garbage is a typed error (InvalidArgumentError for a request, MalformedBatchError for an
answer), never a struct.error or IndexError."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common import stored_send
from raftmq.common.errors import InvalidArgumentError, NotLeaderError, OutOfOrderSequenceError
from raftmq.common.frame import error_from_detail
from raftmq.common.record_batch import MalformedBatchError
from raftmq.common.stored_send import BatchAnswer

answers = st.builds(
    BatchAnswer,
    st.integers(0, 1 << 20),
    st.integers(-1, (1 << 62)),
    st.integers(0, 1 << 40),
    st.integers(0, 4096),
    st.integers(0, 1 << 20),
    st.booleans(),
)


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=10), st.integers(0, 1 << 31))
def test_requests_round_trip(batches: list[bytes], timeout_ms: int) -> None:
    raw = stored_send.encode_request(batches, timeout_ms)
    got_timeout, views = stored_send.decode_request(memoryview(raw), 64)
    assert got_timeout == timeout_ms and [bytes(v) for v in views] == batches


@given(
    st.lists(answers | st.sampled_from(["nl", "ooo"]), max_size=8),
    st.integers(0, 99),
    st.integers(0, 1 << 31),
)
def test_answers_round_trip_with_errors_in_place(
    results: list[BatchAnswer | str], term: int, throttle_ms: int
) -> None:
    errors = {
        "nl": NotLeaderError("not the leader", leader_hint="h:1"),
        "ooo": OutOfOrderSequenceError("later", details={"expected_sequence": "7"}),
    }
    sent = [errors[r] if isinstance(r, str) else r for r in results]
    raw = stored_send.encode_answer("broker-é", term, sent, throttle_ms)
    got = stored_send.decode_answer(raw)
    assert (got.broker_group, got.term, len(got.results)) == ("broker-é", term, len(results))
    assert got.throttle_ms == throttle_ms  # issue 27: the held time, told only when held
    if not throttle_ms:
        assert raw == stored_send.encode_answer("broker-é", term, sent)
    for want, have in zip(sent, got.results, strict=True):
        if isinstance(want, BatchAnswer):
            assert have == want
        else:
            assert have.error is not None
            err = error_from_detail(have.error)
            assert type(err) is type(want) and err.details == want.details


@given(st.binary(max_size=80))
@settings(max_examples=300)
def test_garbage_is_a_typed_error(raw: bytes) -> None:
    with contextlib.suppress(InvalidArgumentError):
        stored_send.decode_request(memoryview(raw), 8)
    with contextlib.suppress(MalformedBatchError):
        stored_send.decode_answer(raw)


def test_a_request_past_the_batch_limit_is_refused() -> None:
    raw = stored_send.encode_request([b"a"] * 5, 0)
    with pytest.raises(InvalidArgumentError, match="more than 4 batches"):
        stored_send.decode_request(memoryview(raw), 4)
    with pytest.raises(InvalidArgumentError, match="at least one batch"):
        stored_send.decode_request(memoryview(stored_send.encode_request([], 0)), 4)
