"""The dispatcher on v2 stored batches (issue 24): the same messages, sent as v1 record batches
or as stamped v2 stored batches, give the same offsets, outcomes, producer windows, tag hashes,
key rows and time rows on the same replica state; only the size column differs (a v2 row keeps
the record's size). Hypothesis drives mixed sequences of both formats, duplicates, gaps and
strict batches included."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState
from raftmq.broker.rows import Appended, OutOfOrder, Rejected
from raftmq.common import stored_batch
from raftmq.common.message import Message
from raftmq.common.record_batch import ProduceBatch, ProducerSequence, encode
from raftmq.raftlog.record import Entry

from .test_dispatch import EmptyState

HOST = "127.0.0.1:1"


@dataclasses.dataclass(frozen=True)
class Spec:
    topic: str
    queue_id: int
    tags: tuple[str | None, ...]
    keys: tuple[tuple[str, ...], ...]
    producer: ProducerSequence | None
    ts_ms: int

    def messages(self) -> tuple[Message, ...]:
        return tuple(
            Message(self.topic, f"b{i}".encode(), t, k, {}, 0, 1, HOST)
            for i, (t, k) in enumerate(zip(self.tags, self.keys, strict=True))
        )

    def v1(self) -> bytes:
        return encode(
            ProduceBatch(self.topic, self.queue_id, self.ts_ms, self.messages(), self.producer)
        )

    def v2(self) -> bytes:
        buf = bytearray(
            stored_batch.encode_batch(
                self.topic, self.queue_id, self.messages(), self.producer, HOST
            )
        )
        stored_batch.stamp(buf, 0, self.ts_ms)
        return bytes(buf)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    n = draw(st.integers(1, 4))
    tags = tuple(draw(st.lists(st.sampled_from([None, "x", "y"]), min_size=n, max_size=n)))
    keys = tuple(tuple(draw(st.lists(st.sampled_from(["k1", "k2"]), max_size=2))) for _ in range(n))
    producer = draw(
        st.none()
        | st.builds(
            ProducerSequence, st.sampled_from(["p", "q"]), st.integers(0, 10), st.booleans()
        )
    )
    return Spec(
        draw(st.sampled_from(["A", "B"])), draw(st.integers(0, 1)), tags, keys, producer,
        draw(st.integers(0, 3_000)),
    )  # fmt: skip


def _run(chunks: list[list[bytes]]) -> list[DispatchOutput]:
    dispatcher, state = Dispatcher(), PendingState(EmptyState())
    outs = []
    for i, entry_chunks in enumerate(chunks, start=1):
        out = dispatcher.apply(Entry(i, 1, tuple(entry_chunks)), state)
        state.absorb(out)
        outs.append(out)
    return outs


def _without_sizes(out: DispatchOutput) -> DispatchOutput:
    batches = tuple(
        dataclasses.replace(b, chunk_offsets=(), body_sizes=(len(b.body_sizes),))
        for b in out.cq_batches
    )
    return dataclasses.replace(out, cq_batches=batches)


@given(
    st.lists(
        st.lists(st.tuples(specs(), st.booleans()), min_size=1, max_size=3), min_size=1, max_size=8
    )
)
@settings(max_examples=80, deadline=None)
def test_v1_and_v2_batches_dispatch_alike(entries: list[list[tuple[Spec, bool]]]) -> None:
    as_v1 = _run([[s.v1() for s, _ in e] for e in entries])
    mixed = _run([[s.v2() if v2 else s.v1() for s, v2 in e] for e in entries])
    assert [_without_sizes(o) for o in as_v1] == [_without_sizes(o) for o in mixed]
    assert [o.key_rows() for o in as_v1] == [o.key_rows() for o in mixed]


def test_v2_rows_point_at_the_records_and_carry_their_sizes() -> None:
    spec = Spec("A", 0, ("x", None), (("k1",), ()), None, 5)
    chunk = spec.v2()
    [out] = _run([[chunk]])
    [batch] = out.cq_batches
    header = stored_batch.read_header(chunk)
    offsets = stored_batch.message_offsets(chunk, header).tolist()
    assert batch.chunk_offsets == tuple(header.records_at + o for o in offsets)
    assert sum(batch.body_sizes) == header.total_bytes - header.records_at
    assert batch.store_timestamp_ms == 5
    assert [m.body for m in stored_batch.iter_messages(chunk)] == [b"b0", b"b1"]
    assert isinstance(out.outcomes[0], Appended)


def test_a_strict_v2_batch_ahead_of_its_sequence_is_refused_unstored() -> None:
    first = Spec("A", 0, (None,), ((),), ProducerSequence("p", 0), 1)
    ahead = Spec("A", 0, (None,), ((),), ProducerSequence("p", 3, strict=True), 2)
    _, out = _run([[first.v2()], [ahead.v2()]])
    assert isinstance(out.outcomes[0], OutOfOrder) and out.outcomes[0].expected == 1
    assert out.cq_batches == ()


def test_an_invalid_topic_in_a_v2_batch_is_rejected_on_every_replica() -> None:
    bad = Spec("bad topic!", 0, (None,), ((),), None, 1)
    [out] = _run([[bad.v2()]])
    assert isinstance(out.outcomes[0], Rejected) and out.cq_batches == ()


def test_an_invalid_producer_id_is_rejected_every_time() -> None:
    """The dispatcher remembers producer ids that passed validate_producer_id (one check per
    id, not per batch); a bad one is never remembered, so every batch of it is rejected."""
    good = Spec("A", 0, (None,), ((),), ProducerSequence("p", 0), 1)
    bad = [Spec("A", 0, (None,), ((),), ProducerSequence(" p", i), 1) for i in range(2)]
    outs = _run([[good.v2(), bad[0].v2()], [bad[1].v2()]])
    assert isinstance(outs[0].outcomes[0], Appended)
    assert isinstance(outs[0].outcomes[1], Rejected) and isinstance(outs[1].outcomes[0], Rejected)
    assert "producer id" in outs[1].outcomes[0].reason
