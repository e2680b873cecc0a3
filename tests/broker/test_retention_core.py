"""Retention's pure decisions (broker/retention.py) and the store's half (retention_store.py):
where the leader cuts, what a cut does to min offsets and lost counts on every replica alike,
bases and their install on a follower, the disk guard's hysteresis (issue 16, item 5)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftmq.broker.dispatch import Dispatcher
from raftmq.broker.retention import (
    MAX_BASES,
    QUIET_MARK_MAX_MS,
    DiskLimits,
    NextCut,
    Proposal,
    QueueCut,
    Reason,
    RetentionPolicy,
    RetentionRecord,
    bases_to_keep,
    decide,
    decode_record,
    deleted_by_retention,
    disk_pressure,
    encode_record,
    losses,
    new_min_offsets,
    next_cut,
    quiet_mark_ms,
    wanted_first_index,
)
from raftmq.broker.store import MessageStore
from raftmq.common.record_batch import MalformedBatchError
from raftmq.raftlog.journal import SegmentInfo
from raftmq.raftlog.record import Entry

from .support import commit, produce
from .test_store import Node

NOW = 1_000_000


def segs(*spec: tuple[int, int, int]) -> list[SegmentInfo]:
    """(first, last, age ms) per segment; the last one is active."""
    return [
        SegmentInfo(f, last, 1000, NOW - age, k == len(spec) - 1)
        for k, (f, last, age) in enumerate(spec)
    ]


def test_record_round_trip_and_malformed() -> None:
    rec = RetentionRecord(1234, Reason.SIZE, 99)
    assert decode_record(encode_record(rec)) == rec
    with pytest.raises(MalformedBatchError):
        decode_record(encode_record(rec)[:-1])
    bad = bytearray(encode_record(rec))
    bad[2] = 9
    with pytest.raises(MalformedBatchError, match="reason"):
        decode_record(bytes(bad))


def test_wanted_first_index_by_time_and_size() -> None:
    s = segs((1, 99, 5000), (100, 199, 3000), (200, 299, 1000), (300, 310, 0))
    assert wanted_first_index(s, RetentionPolicy(2000, 0), NOW) == (200, Reason.TIME)
    assert wanted_first_index(s, RetentionPolicy(0, 2500), NOW) == (200, Reason.SIZE)
    assert wanted_first_index(s, RetentionPolicy(0, 0), NOW) == (1, Reason.MARK)
    # the active segment stays while it is younger than the retention, and under a size limit
    assert wanted_first_index(s, RetentionPolicy(500, 0), NOW)[0] == 300
    assert wanted_first_index(s, RetentionPolicy(0, 1), NOW + 10**6)[0] == 300
    # a quiet journal: the active segment older than the retention goes too (its file stays)
    assert wanted_first_index(s, RetentionPolicy(1, 0), NOW + 10**6) == (311, Reason.TIME)


def test_decide_cuts_right_after_the_newest_base_the_policy_allows() -> None:
    s = segs((1, 99, 5000), (100, 199, 3000), (200, 299, 0))
    policy = RetentionPolicy(2000, 0)
    p = decide(s, [50, 150, 250], 0, 299, policy, NOW)
    assert p is not None and p.record.cut_index == 151 and p.wanted_first_index == 200
    # never past what this node indexed
    p = decide(s, [50, 150, 250], 0, 120, policy, NOW)
    assert p is not None and p.record.cut_index == 51
    # nothing new to cut and a base in the active segment: nothing to do
    assert decide(s, [50, 150, 250], 151, 299, policy, NOW) is None
    # no base in the active segment yet: a mark
    p = decide(s, [50, 150], 151, 299, policy, NOW)
    assert p is not None and p.record == RetentionRecord(0, Reason.MARK, NOW)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    ages=st.lists(st.integers(0, 10_000), min_size=8, max_size=8),
    bases=st.sets(st.integers(0, 400), max_size=10),
    cut=st.integers(0, 200),
    dispatched=st.integers(0, 400),
    retention_ms=st.integers(0, 10_000),
)
def test_decide_never_cuts_what_it_must_keep(
    sizes: list[int],
    ages: list[int],
    bases: set[int],
    cut: int,
    dispatched: int,
    retention_ms: int,
) -> None:
    spec = []
    first = 1
    for k, n in enumerate(sizes):
        spec.append((first, first + n - 1, ages[k]))
        first += n
    s = segs(*spec)
    p = decide(s, bases, cut, dispatched, RetentionPolicy(retention_ms, 0), NOW)
    if p is None or p.record.cut_index == 0:
        return
    c = p.record.cut_index
    assert c - 1 in bases and c > cut  # right after a base, forward only
    assert c <= dispatched + 1  # indexed here
    for seg in s:  # every entry below the cut is in a segment the policy expired (active too)
        if seg.first_index < c:
            assert retention_ms > 0 and seg.mtime_ms < NOW - retention_ms


def test_a_floor_holds_the_cut_back() -> None:
    s = segs((1, 99, 5000), (100, 199, 3000), (200, 299, 0))
    p = decide(s, [50, 150, 250], 0, 299, RetentionPolicy(2000, 0), NOW, floor_index=120)
    assert p is not None and p.record.cut_index == 51
    assert decide(s, [150, 250], 0, 299, RetentionPolicy(2000, 0), NOW, floor_index=120) is None


def test_a_quiet_journal_is_marked_then_cut_through_its_active_segment() -> None:
    policy = RetentionPolicy(4000, 0)
    assert quiet_mark_ms(policy) == 2000 and quiet_mark_ms(RetentionPolicy(0, 10)) == 0
    assert quiet_mark_ms(RetentionPolicy(10**9, 0)) == QUIET_MARK_MAX_MS
    # Messages 1..40 after the base at 20, written 1 s ago: not quiet yet, nothing to do.
    s = segs((1, 40, 1000))
    assert decide(s, [20], 0, 40, policy, NOW) is None
    # Quiet for 2 s: a mark (a base after the last message, at 41)
    p = decide(segs((1, 40, 2000)), [20], 0, 40, policy, NOW)
    assert p is not None and p.record == RetentionRecord(0, Reason.MARK, NOW)
    # the mark wrote to the active segment (its mtime is now); 4 s later: cut through it all
    s = segs((1, 41, 4001))
    assert decide(s, [20, 41], 0, 41, policy, NOW) == Proposal(
        RetentionRecord(42, Reason.TIME, NOW), 42
    )
    # the look ahead saw it coming from the mark on, with its due time
    assert next_cut(segs((1, 41, 0)), [20, 41], 0, 41, policy, NOW) == NextCut(42, NOW + 4001)
    # a size limit alone never cuts the active segment
    assert decide(s, [20, 41], 0, 41, RetentionPolicy(0, 1), NOW) is None


def test_next_cut_looks_ahead_to_the_oldest_segment_above_the_cut() -> None:
    policy = RetentionPolicy(2000, 0)
    s = segs((1, 99, 1500), (100, 199, 500), (200, 299, 0))
    # due when segment 1 ages out, at the newest base it allows
    assert next_cut(s, [50, 99, 150, 250], 0, 299, policy, NOW) == NextCut(100, NOW + 501)
    # a cut the leader would propose now is due now
    old = segs((1, 99, 2500), (100, 199, 500), (200, 299, 0))
    assert next_cut(old, [50, 99, 150, 250], 0, 299, policy, NOW) == NextCut(100, NOW)
    # past the cut already: the next segment
    assert next_cut(s, [50, 99, 150, 199, 250], 100, 299, policy, NOW) == NextCut(200, NOW + 1501)
    # no base to stand on, or no limit: nothing in sight
    assert next_cut(s, [], 0, 299, policy, NOW) is None
    assert next_cut(s, [50, 99], 0, 299, RetentionPolicy(0, 0), NOW) is None


def test_bases_to_keep_is_bounded_and_keeps_the_cut_base() -> None:
    assert bases_to_keep([5, 10, 20], 11) == [10, 20]
    many = list(range(100, 100 + 3 * MAX_BASES))
    kept = bases_to_keep([50, *many], 51)
    assert kept[0] == 50 and len(kept) == MAX_BASES + 1 and kept[-1] == many[-1]


def test_min_offsets_and_losses() -> None:
    now = {("t", 0): (0, 100), ("t", 1): (40, 50), ("u", 0): (0, 10)}
    cuts = new_min_offsets(now, {("t", 0): 60, ("t", 1): 30, ("gone", 0): 5, ("u", 0): 99})
    assert cuts == [QueueCut("t", 0, 0, 60), QueueCut("u", 0, 0, 10)]
    committed = [("g1", "t", 0, 10), ("g2", "t", 0, 70), ("g1", "u", 0, 0), ("g3", "t", 1, 0)]
    got = {(x.group, x.topic): x.messages for x in losses(committed, cuts)}
    assert got == {("g1", "t"): 50, ("g1", "u"): 10}
    assert deleted_by_retention(5, 60, 61) and not deleted_by_retention(5, 60, 0)
    assert not deleted_by_retention(60, 60, 61)


def test_disk_pressure_resumes_below_the_hysteresis() -> None:
    limits = DiskLimits(max_store_bytes=1000, max_used_ratio=0.9)
    assert disk_pressure(limits, 999, 0.5, refusing=False) is None
    assert "max_store_bytes" in (disk_pressure(limits, 1000, 0.5, refusing=False) or "")
    assert disk_pressure(limits, 960, 0.5, refusing=True) is not None  # not yet below 95%
    assert disk_pressure(limits, 940, 0.5, refusing=True) is None
    assert "disk_max_used_ratio" in (disk_pressure(limits, 0, 0.91, refusing=False) or "")
    assert disk_pressure(DiskLimits(0, 1.0), 10**12, 0.999, refusing=False) is None


# ---- the store's half: two replicas, one follower installing a base -------------------------


def feed(node: Node, topic: str = "t") -> None:
    for k in range(5):
        node.entry(produce(topic, 0, 4, ts_ms=1000 + k), produce(topic, 1, 2, ts_ms=1000 + k))
    node.entry(commit("slow", topic, 0, 3), commit("fast", topic, 0, 20))


def retention(cut: int) -> bytes:
    return encode_record(RetentionRecord(cut, Reason.TIME if cut else Reason.MARK, 7))


def test_apply_refuses_a_cut_past_the_floor(tmp_path: Path) -> None:
    from raftmq.broker import retention_store

    n = Node(tmp_path / "s")
    try:
        feed(n)
        mark = n.entry(retention(0)).raft_index
        with n.store._env.begin(write=True) as txn:  # the store's own handles: a white-box check
            applied = retention_store.apply_record(
                txn, n.store._retention, mark + 1, 1, RetentionRecord(mark + 1, Reason.TIME, 0), 3
            )
            txn.abort()
        assert "still referenced" in applied.refused and applied.cut_index == 0
    finally:
        n.store.close()


def test_a_cut_is_the_same_on_every_replica_and_a_base_installs(tmp_path: Path) -> None:
    a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
    try:
        for n in (a, b):
            feed(n)
            mark = n.entry(retention(0)).raft_index  # a base at `mark`
            n.entry(produce("t", 0, 3, ts_ms=2000))
            refused = n.entry(retention(mark + 5))  # no base there: refused, nothing cut
            assert n.store.cut_index == 0 and n.store.cuts_applied[0].refused
            assert refused.raft_index in n.store.base_indexes()
            assert n.store.preview_cut(mark + 5) is None  # no base there
            preview = n.store.preview_cut(mark + 1)  # the warning: what the cut will do
            n.entry(retention(mark + 1))
            done = n.store.cuts_applied[0]
            assert preview == (list(done.queues), list(done.losses)) and done.losses
        for n in (a, b):
            assert n.store.cut_index == mark + 1
            assert n.store.queue_bounds("t", 0) == (20, 23)  # the base's next offsets
            assert n.store.queue_bounds("t", 1) == (10, 10)
            cut = n.store.cuts_applied[0]
            assert {(x.group, x.messages) for x in cut.losses} == {("slow", 17)}
            assert n.store.read_queue("t", 0, 0, 100)[0].queue_offset == 0  # not trimmed yet
            while n.store.trim_step(3):
                pass
            assert [r.queue_offset for r in n.store.read_queue("t", 0, 0, 100)] == [20, 21, 22]
        assert a.store.base_indexes() == b.store.base_indexes()
        blob = a.store.base(mark)
        assert blob is not None and blob == b.store.base(mark)

        # A follower behind the cut installs the base the cut stands on.
        f = MessageStore(tmp_path / "f", map_size_bytes=64 << 20)
        try:
            f.apply([])  # nothing
            assert f.install_base(blob) == mark
            assert f.dispatched_index == mark and f.cut_index == mark + 1
            assert f.queue_bounds("t", 0) == (20, 20)  # its log starts after the base
            assert f.committed_offset("slow", "t", 0) == 3
            assert f.base_indexes() == [mark]
        finally:
            f.close()
    finally:
        a.store.close()
        b.store.close()


# ---- the protocol as a state machine: a replica with the whole history and one that installed
#      the leader's base at some point agree on everything a client can observe ---------------


class ReplicasAgree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rt-sm-"))
        self.full = Node(self.dir / "full")
        self.entries: list[Entry] = []
        self.installed: MessageStore | None = None
        self.n = 0
        self.dispatcher = Dispatcher()

    def _entry(self, *chunks: bytes) -> None:
        out = self.full.entry(*chunks)
        self.entries.append(Entry(out.raft_index, 1, tuple(chunks)))
        if self.installed is not None:
            self._follow(self.installed)

    def _follow(self, store: MessageStore) -> None:
        for e in self.entries[store.dispatched_index :]:
            store.apply(self.dispatcher.apply(e, store))

    @rule(topic=st.sampled_from(["t", "u"]), queue=st.integers(0, 1), n=st.integers(1, 4))
    def produce(self, topic: str, queue: int, n: int) -> None:
        self._entry(produce(topic, queue, n, ts_ms=1000 + len(self.entries)))

    @rule(
        group=st.sampled_from(["g1", "g2"]),
        topic=st.sampled_from(["t", "u"]),
        queue=st.integers(0, 1),
        offset=st.integers(0, 40),
    )
    def commit(self, group: str, topic: str, queue: int, offset: int) -> None:
        self._entry(commit(group, topic, queue, offset))

    @rule()
    def mark(self) -> None:
        self._entry(retention(0))

    @rule(data=st.data())
    def cut(self, data: st.DataObject) -> None:
        bases = [b for b in self.full.store.base_indexes() if b + 1 > self.full.store.cut_index]
        target = data.draw(st.sampled_from(bases)) + 1 if bases else 0
        self._entry(retention(target))

    @rule(index=st.integers(1, 200))
    def cut_anywhere(self, index: int) -> None:  # refused unless right after a base
        self._entry(retention(index))

    @precondition(lambda self: self.full.store.cut_index > 0)
    @rule()
    def install(self) -> None:
        """A new follower behind the cut: the base the current cut stands on, then the rest."""
        if self.installed is not None:
            self.installed.close()
        self.n += 1
        store = MessageStore(self.dir / f"installed-{self.n}", map_size_bytes=16 << 20)
        blob = self.full.store.base(self.full.store.cut_index - 1)
        assert blob is not None
        store.install_base(blob)
        event("a follower installed a base")
        self._follow(store)
        self.installed = store

    @invariant()
    def agree(self) -> None:
        a, b = self.full.store, self.installed
        if b is None:
            return
        assert a.cut_index == b.cut_index and a.dispatched_index == b.dispatched_index
        for topic in ("t", "u"):
            for q in (0, 1):
                bounds = a.queue_bounds(topic, q)
                assert bounds == b.queue_bounds(topic, q)
                rows_a = [r for r in a.read_queue(topic, q, bounds[0], 1000)]
                assert rows_a == b.read_queue(topic, q, bounds[0], 1000)
                for g in ("g1", "g2"):
                    assert a.committed_offset(g, topic, q) == b.committed_offset(g, topic, q)
        # and min offsets only ever rise to a base's next offsets, never past the end
        for topic in ("t", "u"):
            for q in (0, 1):
                low, high = a.queue_bounds(topic, q)
                assert 0 <= low <= high

    def teardown(self) -> None:
        self.full.store.close()
        if self.installed is not None:
            self.installed.close()
        shutil.rmtree(self.dir, ignore_errors=True)


ReplicasAgree.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_replicas_agree = ReplicasAgree.TestCase
