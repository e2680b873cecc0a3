"""A consumer group's config through the log (issue 26, mqadmin updateSubGroup): the record
round-trips, replicas keep the same table whatever the order of sets and deletes (a model
checks it), a group delete takes the config, a base carries it, and a base from a build
before the table installs with it empty."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker import retention_store
from raftmq.broker.retention import Reason, RetentionRecord, encode_record
from raftmq.broker.rows import Applied, Rejected
from raftmq.broker.store import MessageStore
from raftmq.common.group_config import GroupConfig, encode_value
from raftmq.common.record_batch import (
    GroupConfigChange,
    GroupDelete,
    Kind,
    MalformedBatchError,
    decode,
    encode,
)

from .support import commit, produce
from .test_store import Node

GROUPS = ("g", "g-2", "h")
configs = st.builds(
    GroupConfig,
    st.sampled_from(GROUPS),
    st.one_of(st.just(-1), st.integers(-1, 10_000)),  # -1 often: the defaults come up
    st.booleans(),
    st.booleans(),
)


@settings(deadline=None)
@given(configs)
def test_the_record_round_trips(cfg: GroupConfig) -> None:
    assert decode(encode(GroupConfigChange(cfg))) == GroupConfigChange(cfg)


def test_a_record_with_unknown_flags_or_a_short_value_does_not_decode() -> None:
    good = encode(GroupConfigChange(GroupConfig("g", 3, False, True)))
    with pytest.raises(MalformedBatchError, match="unknown flags"):
        decode(good[:-1] + b"\x04")
    with pytest.raises(MalformedBatchError):
        decode(good[:-1])
    assert good[0] == Kind.GROUP_CONFIG


# A set (a config) or a delete (a group name), applied in order on every replica.
ops = st.lists(st.one_of(configs, st.sampled_from(GROUPS)), max_size=12)


@settings(deadline=None, max_examples=40)
@given(ops)
def test_replicas_keep_the_table_a_model_predicts(
    tmp_path_factory: pytest.TempPathFactory, steps: list[GroupConfig | str]
) -> None:
    base = tmp_path_factory.mktemp("gc")
    a, b = Node(base / "a"), Node(base / "b")
    model: dict[str, GroupConfig] = {}
    try:
        for step in steps:
            if isinstance(step, GroupConfig):
                chunk, model[step.group] = encode(GroupConfigChange(step)), step
                if step.is_default:  # the defaults are what no row means
                    del model[step.group]
            else:
                chunk = encode(GroupDelete(step))
                model.pop(step, None)
            for n in (a, b):
                assert isinstance(n.entry(chunk).outcomes[0], Applied)
        a.reopen()  # the mirror is read back from the table
        for n in (a, b):
            assert n.store.group_configs() == sorted(model.values(), key=lambda c: c.group)
            for g in GROUPS:
                assert n.store.group_config(g) == model.get(g, GroupConfig(g))
    finally:
        a.store.close()
        b.store.close()


def test_a_bad_config_is_refused_alike_and_a_delete_takes_the_config(tmp_path: Path) -> None:
    n = Node(tmp_path / "n")
    try:
        n.entry(produce("t", 0, 2), commit("g", "t", 0, 1))
        assert isinstance(n.entry(encode(GroupConfigChange(GroupConfig("g", 2)))).outcomes[0],
                          Applied)  # fmt: skip
        bad = n.entry(encode(GroupConfigChange(GroupConfig("g", 10_001))))
        assert isinstance(bad.outcomes[0], Rejected) and "retry max" in bad.outcomes[0].reason
        assert n.store.group_config("g").retry_max_times == 2
        n.entry(encode(GroupDelete("g")))
        assert n.store.group_config("g") == GroupConfig("g")
        assert n.store.group_configs() == []
    finally:
        n.store.close()


def _without_last_section(blob: bytes) -> bytes:
    """The base as a build without the group config table wrote it: one section fewer."""
    base = retention_store.decode_base(blob)
    head = struct.Struct("<4sIQQI")
    parts = [head.pack(b"RMQB", 2, base.index, base.term, len(base.sections) - 1),
             struct.pack("<Q", base.unbased_rows)]  # fmt: skip
    for rows in base.sections[:-1]:
        parts.append(struct.pack("<I", len(rows)))
        for k, v in rows:
            parts += [struct.pack("<I", len(k)), k, struct.pack("<I", len(v)), v]
    return b"".join(parts)


def test_a_base_carries_configs_and_an_older_base_installs_without(tmp_path: Path) -> None:
    a = Node(tmp_path / "a")
    c = MessageStore(tmp_path / "c", map_size_bytes=64 << 20)
    d = MessageStore(tmp_path / "d", map_size_bytes=64 << 20)
    try:
        cfg = GroupConfig("g", 5, False, False)
        a.entry(produce("t", 0, 1), encode(GroupConfigChange(cfg)))
        mark = a.entry(encode_record(RetentionRecord(0, Reason.MARK, 7))).raft_index
        blob = a.store.base(mark)
        assert blob is not None
        c.install_base(blob)
        assert c.group_config("g") == cfg
        old = _without_last_section(blob)
        assert retention_store.decode_base(old).sections[-1] != [(b"g", encode_value(cfg))]
        d.install_base(old)
        assert d.group_configs() == [] and d.queue_bounds("t", 0) == c.queue_bounds("t", 0)
    finally:
        a.store.close()
        c.close()
        d.close()
