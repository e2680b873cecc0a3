"""Tag expressions and the ConsumeQueue tag hash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.common.filter.sql92 import MAX_EXPRESSION_CHARS, FilterSyntaxError
from raftmq.common.filter.tag import MATCH_ALL, NO_TAG_HASH, parse_tag_expression, tag_hash


@pytest.mark.parametrize("expr", [None, "", "*", "  *  ", "   ", "a || *"])
def test_all_forms(expr: str | None) -> None:
    f = parse_tag_expression(expr)
    assert f.is_all
    assert f.tags is None
    assert f.hash_codes is None
    assert f.matches(None)
    assert f.matches("anything")
    assert f.matches_hash(12345)
    assert MATCH_ALL.is_all


def test_alternatives_with_whitespace() -> None:
    f = parse_tag_expression("  TagA ||TagB||  TagC  || ")
    assert f.tags == frozenset({"TagA", "TagB", "TagC"})
    assert f.hash_codes == frozenset(tag_hash(t) for t in ("TagA", "TagB", "TagC"))
    assert f.matches("TagB")
    assert not f.matches("TagD")
    assert not f.matches(None)  # a message without a tag never matches a specific filter
    assert not f.matches_hash(NO_TAG_HASH)
    assert f.matches_hash(tag_hash("TagC"))


def test_single_tag_is_case_sensitive() -> None:
    f = parse_tag_expression("TagA")
    assert f.tags == frozenset({"TagA"})
    assert not f.matches("taga")


@pytest.mark.parametrize("expr", ["||", " || || ", "|| "])
def test_an_expression_naming_no_tag_is_refused(expr: str) -> None:
    with pytest.raises(FilterSyntaxError) as err:
        parse_tag_expression(expr)
    assert err.value.position == 0
    assert err.value.expected == "a tag or '*'"


def test_length_is_bounded() -> None:
    parse_tag_expression("a" * MAX_EXPRESSION_CHARS)
    with pytest.raises(FilterSyntaxError):
        parse_tag_expression("a" * (MAX_EXPRESSION_CHARS + 1))


def test_tag_hash_is_pinned() -> None:
    # The ConsumeQueue stores exactly this value: a change is a change of the on-disk format.
    assert tag_hash("TagA") == 0x45FBF595B0C4A261
    assert tag_hash(None) == tag_hash("") == NO_TAG_HASH == 0
    assert tag_hash("TagA") != tag_hash("TagB")


tags = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="|"), max_size=12
)


@given(st.text(max_size=40))
def test_tag_hash_is_unsigned_64_bit(tag: str) -> None:
    h = tag_hash(tag)
    assert 0 <= h < 1 << 64
    assert h == tag_hash(tag)


@given(st.lists(tags, min_size=1, max_size=6), tags)
def test_matches_exactly_the_listed_tags(listed: list[str], probe: str) -> None:
    expr = " || ".join(listed)
    wanted = frozenset(t.strip() for t in listed) - {""}
    if not expr.strip():
        assert parse_tag_expression(expr).is_all
        return
    if not wanted or "&&" in expr:  # '&&' is refused: a message has one tag (issue 15)
        with pytest.raises(FilterSyntaxError):
            parse_tag_expression(expr)
        return
    f = parse_tag_expression(expr)
    if "*" in wanted:
        assert f.is_all
        return
    assert f.tags == wanted
    for t in (*wanted, probe):
        assert f.matches(t) == (t in wanted)
        if f.matches(t):  # the broker's hash pre-check never drops a wanted message
            assert f.matches_hash(tag_hash(t))
