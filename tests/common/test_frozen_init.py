"""common/frozen_init.py: the cheaper __init__ of the hot frozen value types behaves exactly as the
one dataclasses generates (fields, defaults, errors, equality, hash, frozenness), refuses what it
could not copy, and is what the dispatcher's per-entry types use."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.broker import rows
from raftmq.broker.dispatch import DispatchOutput
from raftmq.broker.dispatcher_thread import DispatchProgress
from raftmq.common.frozen_init import frozen_init


@dataclass(frozen=True, slots=True)
class Plain:
    topic: str
    queue_id: int
    offsets: tuple[int, ...] = ()
    note: str | None = None


@frozen_init
@dataclass(frozen=True, slots=True)
class Fast:
    topic: str
    queue_id: int
    offsets: tuple[int, ...] = ()
    note: str | None = None


def _call(cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return cls(*args, **kwargs)
    except TypeError:  # the message names the class: compare the kind of failure only
        return TypeError


values = st.one_of(st.text(max_size=3), st.integers(), st.tuples(st.integers()), st.none())


@given(
    args=st.lists(values, max_size=5).map(tuple),
    kwargs=st.dictionaries(
        st.sampled_from(["topic", "queue_id", "offsets", "note", "other"]), values, max_size=3
    ),
)
def test_the_fast_init_takes_and_refuses_what_the_dataclass_one_does(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    plain, fast = _call(Plain, args, kwargs), _call(Fast, args, kwargs)
    if plain is TypeError:
        assert fast is TypeError
        return
    assert dataclasses.astuple(fast) == dataclasses.astuple(plain)
    assert repr(fast) == repr(plain).replace("Plain(", "Fast(", 1)
    same = _call(Fast, args, kwargs)
    assert fast == same and hash(fast) == hash(same)
    assert dataclasses.replace(fast, queue_id=7).queue_id == 7
    with pytest.raises(FrozenInstanceError):
        fast.topic = "x"  # type: ignore[misc]  # the frozen check under test


def test_what_it_cannot_copy_is_refused() -> None:
    with pytest.raises(TypeError, match="frozen, slotted"):

        @frozen_init
        @dataclass(slots=True)
        class NotFrozen:
            a: int

    with pytest.raises(TypeError, match="frozen, slotted"):

        @frozen_init
        @dataclass(frozen=True)
        class NoSlots:
            a: int

    with pytest.raises(TypeError, match="plain fields"):

        @frozen_init
        @dataclass(frozen=True, slots=True)
        class Factory:
            a: tuple[int, ...] = field(default_factory=tuple)

    with pytest.raises(TypeError, match="plain fields"):

        @frozen_init
        @dataclass(frozen=True, slots=True, kw_only=True)
        class KeywordOnly:
            a: int

    with pytest.raises(TypeError, match="__post_init__"):

        @frozen_init
        @dataclass(frozen=True, slots=True)
        class Checked:
            a: int

            def __post_init__(self) -> None:
                pass


HOT = [
    DispatchOutput,
    DispatchProgress,
    rows.CQRow,
    rows.CQBatch,
    rows.TimeRow,
    rows.QueueHead,
    rows.BatchOrigin,
    rows.ProducerState,
    rows.ProducerRow,
    rows.StoredRange,
    rows.Appended,
]


@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_the_types_made_per_entry_use_it(cls: type[Any]) -> None:
    """The dispatcher makes ~10 of these per committed entry: with the dataclass __init__ they
    were ~40 % of Dispatcher.apply's time (docs/benchmarks.md)."""
    fields = dataclasses.fields(cls)
    assert f"_set_{fields[0].name}" in cls.__init__.__globals__
    required = [f for f in fields if f.default is dataclasses.MISSING]
    made = cls(*(object() for _ in required))
    for f in fields:
        assert hasattr(made, f.name)
