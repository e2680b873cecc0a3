"""A consumer group deleted through the log (issue 26, mqadmin deleteSubGroup --removeOffset):
every replica drops exactly that group's committed offsets, and nothing of a group whose name
it prefixes; the record round-trips and a bad name is rejected alike everywhere."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.rows import Applied, Rejected
from raftmq.common.record_batch import GroupDelete, decode, encode

from .support import commit, produce
from .test_store import Node


@settings(deadline=None)
@given(st.text(alphabet="abc-_%|09", min_size=1, max_size=20))
def test_the_record_round_trips(group: str) -> None:
    assert decode(encode(GroupDelete(group))) == GroupDelete(group)


def test_a_deleted_groups_offsets_go_and_only_its(tmp_path: Path) -> None:
    a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
    try:
        for n in (a, b):
            n.entry(produce("t", 0, 4), produce("u", 1, 2))
            n.entry(commit("g", "t", 0, 3), commit("g", "u", 1, 1), commit("g-2", "t", 0, 2))
            out = n.entry(encode(GroupDelete("g")))
            assert isinstance(out.outcomes[0], Applied), out.outcomes
            bad = n.entry(encode(GroupDelete("no spaces")))
            assert isinstance(bad.outcomes[0], Rejected)
        for n in (a, b):
            assert n.store.committed_offset("g", "t", 0) is None
            assert n.store.committed_offset("g", "u", 1) is None
            assert n.store.committed_offset("g-2", "t", 0) == 2  # "g" prefixes it: kept
            assert n.store.all_committed_offsets(100) == [("g-2", "t", 0, 2)]
        # Committed again later: the group is back, from that commit on.
        a.entry(commit("g", "t", 0, 4))
        assert a.store.committed_offset("g", "t", 0) == 4
    finally:
        a.store.close()
        b.store.close()
