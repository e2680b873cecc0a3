"""The SQL92 property filter: RocketMQ's operators, three-valued logic, errors and limits."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.filter.sql92 import (
    MAX_EXPRESSION_CHARS,
    MAX_NESTING_DEPTH,
    And,
    Compare,
    CompareMode,
    FilterSyntaxError,
    compile_filter,
    property_number,
)


def m(expr: str, props: dict[str, str] | None = None, tag: str | None = None) -> bool:
    return compile_filter(expr).matches(props or {}, tag)


# ---- operators ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "props", "expected"),
    [
        ("a > 5", {"a": "6"}, True),
        ("a > 5", {"a": "5"}, False),
        ("a >= 5", {"a": "5"}, True),
        ("a < 5.5", {"a": "5"}, True),
        ("a <= -1", {"a": "-1"}, True),
        ("a <= -1", {"a": "-0.5"}, False),
        ("a = 3", {"a": "3.0"}, True),  # a number literal compares numbers
        ("a = '3'", {"a": "3.0"}, False),  # a string literal compares strings
        ("a = '3'", {"a": "3"}, True),
        ("a <> 3", {"a": "4"}, True),
        ("a <> 'x'", {"a": "x"}, False),
        ("a = 1e3", {"a": "1000"}, True),
        ("a = .5", {"a": "0.5"}, True),
        ("a > +2", {"a": "3"}, True),
        ("5 < a", {"a": "6"}, True),
        ("a < b", {"a": "2", "b": "10"}, True),  # properties with < compare numbers
        ("a = b", {"a": "1", "b": "1.0"}, False),  # and with = compare strings
        ("a = b", {"a": "x", "b": "x"}, True),
        ("a BETWEEN 1 AND 3", {"a": "3"}, True),
        ("a BETWEEN 1 AND 3", {"a": "0"}, False),
        ("a NOT BETWEEN 1 AND 3", {"a": "0"}, True),
        ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
        ("a BETWEEN lo AND hi", {"a": "2", "lo": "1", "hi": "2"}, True),
        ("a IN ('x', 'y')", {"a": "y"}, True),
        ("a IN ('x')", {"a": "z"}, False),
        ("a NOT IN ('x', 'y')", {"a": "z"}, True),
        ("a IS NULL", {}, True),
        ("a IS NULL", {"a": ""}, False),
        ("a IS NOT NULL", {"a": ""}, True),
        ("a CONTAINS 'ell'", {"a": "hello"}, True),
        ("a NOT CONTAINS 'ell'", {"a": "hello"}, False),
        ("a STARTSWITH 'he'", {"a": "hello"}, True),
        ("a NOT STARTSWITH 'he'", {"a": "hello"}, False),
        ("a ENDSWITH 'lo'", {"a": "hello"}, True),
        ("a NOT ENDSWITH 'x'", {"a": "hello"}, True),
        ("a = 'it''s'", {"a": "it's"}, True),
        ("a = ''", {"a": ""}, True),
        ("TRUE", {}, True),
        ("FALSE", {}, False),
        ("NOT FALSE", {}, True),
        ("b = TRUE", {"b": "True"}, True),
        ("FALSE = b", {"b": "false"}, True),
        ("b = TRUE", {"b": "yes"}, False),
        ("a > 1 AND b = 'x' OR c = 'y'", {"c": "y"}, True),  # AND binds tighter than OR
        ("a > 1 AND (b = 'x' OR c = 'y')", {"c": "y"}, False),
        ("NOT a = 1 AND b = 2", {"a": "2", "b": "2"}, True),  # NOT binds tighter than AND
        ("a between 1 and 3 or A In ('q')", {"A": "q"}, True),  # keywords in any case
        ("x.y_z$ = 'v'", {"x.y_z$": "v"}, True),
        ("1 = 1", {}, True),
        ("'a' <> 'b'", {}, True),
    ],
)
def test_operators(expr: str, props: dict[str, str], expected: bool) -> None:
    assert m(expr, props) is expected


def test_identifiers_are_case_sensitive() -> None:
    assert not m("A = 'x'", {"a": "x"})


def test_tags_pseudo_property() -> None:
    f = compile_filter("TAGS IN ('TagA', 'TagB') AND region = 'eu'")
    assert f.matches({"region": "eu"}, tag="TagA")
    assert not f.matches({"region": "eu"}, tag="TagC")
    assert not f.matches({"region": "eu"})  # no tag: TAGS is missing
    assert f.matches({"region": "eu", "TAGS": "TagB"})  # or stored as a property, RocketMQ-style
    assert f.matches({"region": "eu", "TAGS": "TagC"}, tag="TagB")  # the argument wins
    assert m("TAGS IS NULL")
    assert f.properties == frozenset({"TAGS", "region"})


# ---- missing and mistyped properties: UNKNOWN, never an error, never a match --------------------


@pytest.mark.parametrize(
    "expr",
    [
        "a > 1",
        "a = 1",
        "a <> 1",
        "a = 'x'",
        "a <> 'x'",
        "a BETWEEN 1 AND 2",
        "a NOT BETWEEN 1 AND 2",
        "a IN ('x')",
        "a NOT IN ('x')",
        "a CONTAINS 'x'",
        "a NOT CONTAINS 'x'",
        "a STARTSWITH 'x'",
        "a ENDSWITH 'x'",
        "a = TRUE",
        "a < b",
    ],
)
def test_missing_property_is_unknown_even_under_not(expr: str) -> None:
    f = compile_filter(expr)
    assert f.evaluate({}) is None
    assert not f.matches({})
    assert not compile_filter(f"NOT ({expr})").matches({})
    assert m(f"({expr}) OR TRUE")
    assert not m(f"({expr}) AND TRUE")


@pytest.mark.parametrize(
    "value",
    ["abc", "", " 1", "1 ", "1_000", "inf", "nan", "0x10", "\u0661", "1e", "--1", "9" * 5000],
)
def test_non_numeric_value_in_numeric_comparison_is_unknown(value: str) -> None:
    for expr in ("a > 1", "a = 1", "a <> 1", "a BETWEEN 0 AND 2", "a < b"):
        f = compile_filter(expr)
        assert f.evaluate({"a": value, "b": "5"}) is None
        assert not f.matches({"a": value, "b": "5"})


def test_property_numbers() -> None:
    assert property_number("42") == 42
    assert property_number("-4.5e1") == -45.0
    assert property_number("+.5") == 0.5
    assert property_number("1.") == 1.0
    assert property_number("123456789012345678901234567890") == 123456789012345678901234567890
    assert property_number("abc") is None


def test_large_integers_compare_exactly() -> None:
    assert m("a > 9007199254740992", {"a": "9007199254740993"})


# ---- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "position", "expected"),
    [
        ("", 0, "a property, literal, NOT or '('"),
        ("a >", 3, "a property or literal"),
        ("a", 1, "a comparison operator (= <> < <= > >=), BETWEEN, IN, IS, CONTAINS"),
        ("a = 1 b", 6, "AND, OR or end of expression"),
        ("(a = 1", 6, "')' or AND/OR"),
        ("a = 'x", 4, "a closing quote for the string"),
        ("a != 1", 2, "an identifier, literal or operator"),
        ('a = "x"', 4, "an identifier, literal or operator"),
        ("a > 'x'", 4, "a number or property for >"),
        ("a BETWEEN 1 AND 'x'", 16, "a number or property for BETWEEN"),
        ("a BETWEEN 1 OR 2", 12, "AND"),
        ("a IN ('x', 1)", 11, "a string literal"),
        ("a IN 'x'", 5, "'(' after IN"),
        ("a IN ('x' 'y')", 10, "',' or ')'"),
        ("'x' IN ('x')", 0, "a property name before IN"),
        ("1 IS NULL", 0, "a property name before IS"),
        ("a IS NOT 1", 9, "NULL"),
        ("a = NULL", 4, "a property or literal"),
        ("a CONTAINS 1", 11, "a string literal"),
        ("a LIKE 'x%'", 2, "a supported operator"),
        ("a NOT LIKE 'x%'", 6, "BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH"),
        ("a = 'x' AND", 11, "a property, literal, NOT or '('"),
        ("a = 1x", 4, "a number"),
        ("a = -b", 5, "a number after '-'"),
        ("TRUE = 1", 7, "a boolean to compare with TRUE"),
        ("a = 1 = 2", 6, "AND, OR or end of expression"),
        ("a = 'x' AND AND", 12, "a property, literal, NOT or '('"),
        ("é = 1", 0, "an identifier, literal or operator"),
    ],
)
def test_syntax_errors_say_where_and_what(expr: str, position: int, expected: str) -> None:
    with pytest.raises(FilterSyntaxError) as err:
        compile_filter(expr)
    assert err.value.position == position
    assert err.value.expected.startswith(expected)
    assert f"at position {position}" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_error_hints() -> None:
    with pytest.raises(FilterSyntaxError, match="<>"):
        compile_filter("a != 1")
    with pytest.raises(FilterSyntaxError, match="IS NULL"):
        compile_filter("a = NULL")
    with pytest.raises(FilterSyntaxError, match="CONTAINS"):
        compile_filter("a LIKE 'x'")


# ---- limits -------------------------------------------------------------------------------------


def test_expression_length_is_bounded() -> None:
    base = "a = '"
    ok = base + "x" * (MAX_EXPRESSION_CHARS - len(base) - 1) + "'"
    assert len(ok) == MAX_EXPRESSION_CHARS
    assert m(ok, {"a": ok[len(base) : -1]})
    with pytest.raises(FilterSyntaxError) as err:
        compile_filter(ok + " ")
    assert err.value.position == MAX_EXPRESSION_CHARS


def test_nesting_depth_is_bounded() -> None:
    depth = MAX_NESTING_DEPTH
    assert m("(" * depth + "a = 1" + ")" * depth, {"a": "1"})
    assert m("NOT " * depth + "a = 1", {"a": "1"}) is (depth % 2 == 0)
    assert m("(NOT " * (depth // 2) + "a = 1" + ")" * (depth // 2), {"a": "1"})
    for expr in (
        "(" * (depth + 1) + "a = 1" + ")" * (depth + 1),
        "NOT " * (depth + 1) + "a = 1",
        "(NOT " * (depth // 2) + "NOT a = 1" + ")" * (depth // 2),
    ):
        with pytest.raises(FilterSyntaxError, match="levels"):
            compile_filter(expr)


def test_long_flat_chains_do_not_nest() -> None:
    n = 300
    f = compile_filter(" AND ".join(f"a{i}=1" for i in range(n)))
    assert isinstance(f.ast, And)
    assert len(f.ast.terms) == n
    assert f.matches({f"a{i}": "1" for i in range(n)})
    assert not f.matches({f"a{i}": "1" for i in range(n - 1)})
    g = compile_filter(" OR ".join(f"(a{i} = 1 AND b = 2)" for i in range(150)))
    assert g.matches({"a149": "1", "b": "2"})


def test_compile_once_and_describe() -> None:
    f = compile_filter("a > 1")
    assert f.expression == "a > 1"
    assert f.ast == compile_filter("a   >   1").ast
    assert isinstance(f.ast, Compare)
    assert f.ast.mode is CompareMode.NUMBER


# ---- properties ---------------------------------------------------------------------------------

PROPS = ("a", "b", "c")
small_numbers = st.one_of(
    st.integers(-5, 5), st.sampled_from([-2.5, -0.5, 0.0, 0.5, 1.5, 2.5, 1e3])
)
short_strings = st.text(alphabet="xy1'", max_size=3)


def _num(n: int | float) -> str:
    return repr(n)


def _str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


props_names = st.sampled_from(PROPS)
cmp_ops = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])
leaves = st.one_of(
    st.builds(lambda p, o, n: f"{p} {o} {_num(n)}", props_names, cmp_ops, small_numbers),
    st.builds(lambda n, o, p: f"{_num(n)} {o} {p}", small_numbers, cmp_ops, props_names),
    st.builds(lambda p, o, q: f"{p} {o} {q}", props_names, cmp_ops, props_names),
    st.builds(
        lambda p, neg, lo, hi: f"{p} {neg}BETWEEN {_num(lo)} AND {_num(hi)}",
        props_names,
        st.sampled_from(["", "NOT "]),
        small_numbers,
        small_numbers,
    ),
    st.builds(
        lambda p, o, s: f"{p} {o} {_str(s)}",
        props_names,
        st.sampled_from(["=", "<>"]),
        short_strings,
    ),
    st.builds(
        lambda p, neg, vals: f"{p} {neg}IN ({', '.join(_str(v) for v in vals)})",
        props_names,
        st.sampled_from(["", "NOT "]),
        st.lists(short_strings, min_size=1, max_size=3),
    ),
    st.builds(lambda p, neg: f"{p} IS {neg}NULL", props_names, st.sampled_from(["", "NOT "])),
    st.builds(
        lambda p, neg, kw, s: f"{p} {neg}{kw} {_str(s)}",
        props_names,
        st.sampled_from(["", "NOT "]),
        st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
        short_strings,
    ),
    st.sampled_from(["TRUE", "FALSE"]),
)
expressions = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds(lambda x, y: f"({x}) AND ({y})", inner, inner),
        st.builds(lambda x, y: f"({x}) OR ({y})", inner, inner),
        st.builds(lambda x: f"NOT ({x})", inner),
    ),
    max_leaves=8,
)
numeric_props = st.fixed_dictionaries({p: small_numbers.map(_num) for p in PROPS})
any_props = st.dictionaries(
    props_names, st.one_of(small_numbers.map(_num), short_strings), max_size=3
)


@given(expressions, numeric_props)
def test_not_is_negation_when_every_property_exists(expr: str, props: dict[str, str]) -> None:
    f = compile_filter(expr)
    assert f.evaluate(props) is not None
    assert compile_filter(f"NOT ({expr})").matches(props) is not f.matches(props)


@given(expressions, any_props)
def test_three_valued_logic_laws(expr: str, props: dict[str, str]) -> None:
    value = compile_filter(expr).evaluate(props)
    negated = compile_filter(f"NOT ({expr})").evaluate(props)
    assert negated == (None if value is None else not value)
    assert compile_filter(f"NOT (NOT ({expr}))").evaluate(props) == value
    assert compile_filter(f"({expr}) OR TRUE").evaluate(props) is True
    assert compile_filter(f"({expr}) AND FALSE").evaluate(props) is False


@given(expressions, expressions, any_props)
def test_de_morgan(x: str, y: str, props: dict[str, str]) -> None:
    left = compile_filter(f"NOT (({x}) AND ({y}))").evaluate(props)
    right = compile_filter(f"(NOT ({x})) OR (NOT ({y}))").evaluate(props)
    assert left == right


@given(props_names, small_numbers, small_numbers, any_props)
def test_between_is_ge_and_le(
    p: str, lo: int | float, hi: int | float, props: dict[str, str]
) -> None:
    between = compile_filter(f"{p} BETWEEN {_num(lo)} AND {_num(hi)}").evaluate(props)
    both = compile_filter(f"{p} >= {_num(lo)} AND {p} <= {_num(hi)}").evaluate(props)
    assert between == both
    not_between = compile_filter(f"{p} NOT BETWEEN {_num(lo)} AND {_num(hi)}").evaluate(props)
    either = compile_filter(f"{p} < {_num(lo)} OR {p} > {_num(hi)}").evaluate(props)
    assert not_between == either


OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@given(
    cmp_ops,
    st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
    st.integers(-(10**6), 10**6),
)
def test_numeric_comparison_agrees_with_python(op: str, value: int | float, literal: int) -> None:
    expected = OPS[op](value, literal)
    assert m(f"a {op} {literal}", {"a": repr(value)}) is expected


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30))
def test_any_string_literal_round_trips(s: str) -> None:
    assert m(f"a = {_str(s)}", {"a": s})
    assert m(f"a IN ({_str(s)}, 'other')", {"a": s})
    assert m(f"a CONTAINS {_str(s)}", {"a": "<" + s + ">"})


TOKENS = [
    "a", "b", "TAGS", "NOT", "AND", "OR", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE",
    "CONTAINS", "STARTSWITH", "ENDSWITH", "LIKE", "(", ")", ",", "=", "<>", "<", "<=", ">", ">=",
    "!=", "-", "+", "1", "2.5", "-3", "1e3", ".5", "'x'", "''", "'it''s'", "'", '"', "é", "\t",
]  # fmt: skip


@settings(max_examples=300)
@given(
    st.one_of(
        st.text(max_size=60),
        st.lists(st.sampled_from(TOKENS), max_size=14).map(" ".join),
        st.lists(st.sampled_from(TOKENS), max_size=14).map("".join),
    ),
    any_props,
    st.one_of(st.none(), short_strings),
)
def test_garbage_raises_only_filter_syntax_error(
    expr: str, props: dict[str, str], tag: str | None
) -> None:
    try:
        f = compile_filter(expr)
    except FilterSyntaxError as err:
        assert 0 <= err.position <= len(expr)
        return
    assert f.evaluate(props, tag) in (True, False, None)
    assert isinstance(f.matches(props, tag), bool)
