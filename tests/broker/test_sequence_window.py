"""Several batches of one queue in flight under the idempotent producer (issue 14): the
dispatcher's strict-sequence check, directly and as a property over every order in which
attempts can reach the log.

The producer sends each batch strict unless it is the oldest of its queue still without an
outcome (client/accumulator.py `is_oldest`); attempts arrive in any order, answers get lost,
batches are given up. Whatever happens, no batch the producer was told is stored is missing or
elsewhere than it was told, the queue holds no sequence twice and holds them in order. Without
the check a strict batch stored ahead of an earlier one makes that one's retry a "duplicate"
that is acknowledged and never stored: both tests fail then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.dispatch import Dispatcher, PendingState
from raftmq.broker.rows import Appended, Duplicate, OutOfOrder, Rejected
from raftmq.common.record_batch import ProduceBatch, ProducerSequence, decode, encode
from raftmq.raftlog.record import Entry

from .support import msg
from .test_dispatch import EmptyState

TOPIC = "T"
PID = "p-window"
WINDOW = 5  # batches in flight per queue (Kafka's, the producer's maximum)


def chunk(first_seq: int, count: int, *, strict: bool) -> bytes:
    messages = tuple(msg(TOPIC, b"%d" % (first_seq + i)) for i in range(count))
    return encode(ProduceBatch(TOPIC, 0, 1_000, messages, ProducerSequence(PID, first_seq, strict)))


class Log:
    """Entries applied by one dispatcher, as the dispatcher thread applies them."""

    def __init__(self) -> None:
        self.dispatcher = Dispatcher(recent_batches_per_producer=WINDOW)
        self.state = PendingState(EmptyState())
        self.index = 0
        self.queue: list[int] = []  # the sequences stored in queue 0, in offset order

    def append(self, data: bytes) -> Appended | Duplicate | Rejected:
        self.index += 1
        out = self.dispatcher.apply(Entry(self.index, 1, (data,)), self.state)
        self.state.absorb(out)
        for batch in out.cq_batches:
            assert batch.first_offset == len(self.queue)
            self.queue.extend(int(b) for b in bodies_of(data))
        (outcome,) = out.outcomes
        assert isinstance(outcome, (Appended, Duplicate, Rejected))
        return outcome


def bodies_of(data: bytes) -> list[bytes]:
    record = decode(data)
    assert isinstance(record, ProduceBatch)
    return [m.body for m in record.messages]


def test_a_batch_that_overtakes_an_earlier_one_waits_for_it() -> None:
    log = Log()
    assert isinstance(log.append(chunk(0, 2, strict=False)), Appended)  # batch 1, the oldest
    # batch 3 overtakes batch 2 (being retried): refused, unstored
    early = log.append(chunk(4, 2, strict=True))
    assert isinstance(early, OutOfOrder) and early.expected == 2
    assert log.queue == [0, 1]
    second = log.append(chunk(2, 2, strict=True))
    assert isinstance(second, Appended) and second.stored.first_offset == 2
    third = log.append(chunk(4, 2, strict=True))
    assert isinstance(third, Appended) and third.stored.first_offset == 4
    # batch 2's answer was lost: its retry gets the original offsets, nothing stored twice
    retry = log.append(chunk(2, 2, strict=True))
    assert isinstance(retry, Duplicate) and retry.stored is not None
    assert retry.stored.first_offset == 2
    assert log.queue == [0, 1, 2, 3, 4, 5]


def test_the_oldest_batch_may_skip_sequences_given_up() -> None:
    log = Log()
    log.append(chunk(0, 1, strict=False))
    # sequences 1..2 were given up (failed for good, never stored): the oldest skips them
    skipped = log.append(chunk(3, 1, strict=False))
    assert isinstance(skipped, Appended) and skipped.sequence_gap is not None
    assert log.queue == [0, 3]


@dataclass
class Batch:
    first: int
    count: int
    outcome: str = ""  # "", "stored" (told where), "given up"
    told_offset: int = -1


@dataclass
class Producer:
    """The SDK's rule, reduced: a window of batches, strict unless the oldest unresolved."""

    sizes: list[int]
    batches: list[Batch] = field(default_factory=list)
    wire: list[tuple[int, bytes]] = field(default_factory=list)  # attempts on the way

    def __post_init__(self) -> None:
        seq = 0
        for n in self.sizes:
            self.batches.append(Batch(seq, n))
            seq += n

    def unresolved(self) -> list[int]:
        return [i for i, b in enumerate(self.batches) if not b.outcome]

    def in_window(self) -> list[int]:
        return self.unresolved()[:WINDOW]

    def send(self, i: int) -> None:
        b = self.batches[i]
        strict = self.unresolved()[0] != i
        self.wire.append((i, chunk(b.first, b.count, strict=strict)))

    def deliver(self, log: Log, k: int, answer_lost: bool) -> None:
        i, data = self.wire.pop(k)
        outcome = log.append(data)
        b = self.batches[i]
        if answer_lost or b.outcome:
            return
        if isinstance(outcome, Appended):
            b.outcome, b.told_offset = "stored", outcome.stored.first_offset
        elif isinstance(outcome, Duplicate):
            # stored by an earlier attempt; past the broker's memory of 5 batches (later ones
            # given up and so out of the window) the offsets are no longer known (-1)
            b.outcome = "stored"
            b.told_offset = outcome.stored.first_offset if outcome.stored is not None else -1
        else:
            assert isinstance(outcome, OutOfOrder), outcome  # retried later


steps = st.lists(
    st.tuples(
        st.sampled_from(["send", "deliver", "give up"]),
        st.integers(0, 10_000),
        st.booleans(),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=12), plan=steps)
def test_any_arrival_order_keeps_every_acknowledged_batch_once_and_in_order(
    sizes: list[int], plan: list[tuple[str, int, bool]]
) -> None:
    log, p = Log(), Producer(sizes)
    for action, pick, flag in plan:
        window = p.in_window()
        if action == "send" and window:
            p.send(window[pick % len(window)])
        elif action == "deliver" and p.wire:
            p.deliver(log, pick % len(p.wire), answer_lost=flag)
        elif action == "give up" and window and flag:
            p.batches[window[pick % len(window)]].outcome = "given up"
    # then the producer retries what is left, oldest first, until every batch has an outcome;
    # attempts still on the way arrive in the end (late duplicates of given-up batches too)
    for _ in range(10 * len(sizes) + 10):
        window = p.unresolved()
        if not window:
            break
        p.send(window[0])
        p.deliver(log, len(p.wire) - 1, answer_lost=False)
    assert not p.unresolved()
    while p.wire:
        p.deliver(log, 0, answer_lost=False)

    # each sequence at most once, in increasing order
    assert log.queue == sorted(set(log.queue))
    for b in p.batches:
        seqs = list(range(b.first, b.first + b.count))
        if b.outcome == "stored" and b.told_offset >= 0:  # acknowledged: exactly there
            assert log.queue[b.told_offset : b.told_offset + b.count] == seqs
        elif b.outcome == "stored":  # acknowledged as a duplicate of unknown offsets: there
            assert all(s in log.queue for s in seqs)
        else:  # given up: stored whole or not at all (the producer said "unknown")
            present = [s in log.queue for s in seqs]
            assert all(present) or not any(present)
