"""A stateful test of dispatch + store against a simple model: produce to random queues, commit
and reset offsets, dispatch in batches, crash before a commit, reopen, wipe and rebuild from the
log. After every step the store must equal the model replayed up to its dispatched index."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState
from raftmq.broker.store import MessageStore
from raftmq.common.filter.tag import tag_hash

from .support import InProcessLog, commit, produce, reset

TOPICS = ("A", "B")
QUEUES = (0, 1, 2)
GROUPS = ("g1", "g2")
TAGS = (None, "x", "y")

topics = st.sampled_from(TOPICS)
queues = st.sampled_from(QUEUES)
groups = st.sampled_from(GROUPS)
offsets = st.integers(0, 40)


@dataclass(frozen=True)
class ProduceOp:
    topic: str
    queue_id: int
    count: int
    tag: str | None


@dataclass(frozen=True)
class CommitOp:
    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True)
class ResetOp:
    group: str
    topic: str
    offsets: dict[int, int]


Op = ProduceOp | CommitOp | ResetOp

chunk_ops = st.lists(
    st.one_of(
        st.builds(ProduceOp, topics, queues, st.integers(1, 4), st.sampled_from(TAGS)),
        st.builds(CommitOp, groups, topics, queues, offsets),
        st.builds(ResetOp, groups, topics, st.dictionaries(queues, offsets, max_size=3)),
    ),
    max_size=3,
)


@dataclass
class Model:
    """What the store must hold after dispatching a prefix of the log."""

    # (topic, queue) -> per offset: (raft index, slot, position, tag hash)
    queues: dict[tuple[str, int], list[tuple[int, int, int, int]]] = field(default_factory=dict)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)


def replay(entries: list[list[Op]], upto: int) -> Model:
    m = Model()
    for index, ops in enumerate(entries[:upto], start=1):
        for slot, op in enumerate(ops):
            if isinstance(op, ProduceOp):
                rows = m.queues.setdefault((op.topic, op.queue_id), [])
                rows.extend((index, slot, pos, tag_hash(op.tag)) for pos in range(op.count))
            elif isinstance(op, CommitOp):
                m.offsets[op.group, op.topic, op.queue_id] = op.offset
            else:
                for q, off in op.offsets.items():
                    m.offsets[op.group, op.topic, q] = off
    return m


def to_chunk(op: Op) -> bytes:
    if isinstance(op, ProduceOp):
        return produce(op.topic, op.queue_id, op.count, tags=op.tag)
    if isinstance(op, CommitOp):
        return commit(op.group, op.topic, op.queue_id, op.offset)
    return reset(op.group, op.topic, op.offsets)


class StoreMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raftmq-store-"))
        self.path = self.dir / "store"
        self.log = InProcessLog()
        self.ops: list[list[Op]] = []
        self.store = MessageStore(self.path, map_size_bytes=32 << 20)
        self.dispatcher = Dispatcher()

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- the log grows (committed, not yet dispatched) ----------------------------------------

    @rule(ops=chunk_ops)
    def append_entry(self, ops: list[Op]) -> None:
        self.log.append([to_chunk(op) for op in ops])  # no ops: a raft control entry
        self.ops.append(ops)

    # ---- dispatch, as the dispatcher thread does it -------------------------------------------

    def _outputs(self, k: int) -> list[DispatchOutput]:
        start = self.store.dispatched_index + 1
        entries = self.log.read_from(start, max_bytes=1 << 20, max_entries=k)
        state = PendingState(self.store)
        outs = []
        for e in entries:
            out = self.dispatcher.apply(e, state)
            state.absorb(out)
            outs.append(out)
        return outs

    @rule(k=st.integers(1, 5))
    def dispatch(self, k: int) -> None:
        self.store.apply(self._outputs(k))

    @rule(k=st.integers(1, 5))
    def crash_before_commit(self, k: int) -> None:
        """Outputs computed but the transaction never committed: a restart resumes from the
        stored dispatched index with the remaining entries."""
        self._outputs(k)
        self.reopen()

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = MessageStore(self.path, map_size_bytes=32 << 20)

    @rule()
    def wipe_and_rebuild(self) -> None:
        """The store is disposable: rebuilt from the log from index 1."""
        self.store.close()
        shutil.rmtree(self.path)
        self.store = MessageStore(self.path, map_size_bytes=32 << 20)
        assert self.store.dispatched_index == 0

    # ---- the store equals the model at its dispatched index -----------------------------------

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "store"):
            return
        upto = self.store.dispatched_index
        assert 0 <= upto <= self.log.committed_index
        model = replay(self.ops, upto)
        for topic in TOPICS:
            for q in QUEUES:
                expected = model.queues.get((topic, q), [])
                assert self.store.queue_bounds(topic, q) == (0, len(expected))
                rows = self.store.read_queue(topic, q, 0, 1000)
                got = [(r.raft_index, r.slot, r.position, r.tag_hash) for r in rows]
                assert got == expected
                assert [r.queue_offset for r in rows] == list(range(len(expected)))
                x = tag_hash("x")
                filtered = self.store.read_queue(topic, q, 0, 1000, [x])
                assert [(r.raft_index, r.slot, r.position) for r in filtered] == [
                    row[:3] for row in expected if row[3] == x
                ]
        for g in GROUPS:
            for topic in TOPICS:
                want = {
                    q: off for (gg, t, q), off in model.offsets.items() if (gg, t) == (g, topic)
                }
                assert self.store.committed_offsets(g, topic) == want
                for q in QUEUES:
                    assert self.store.committed_offset(g, topic, q) == want.get(q)


StoreMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestStoreMachine = StoreMachine.TestCase
