"""RocketMQ's SQL92 property filter: tokenizer, recursive-descent parser, AST and evaluator.

Sans-I/O and stateless: compiles an expression once and evaluates it against a message's string
properties. Never reads a clock, never raises on a message, only on a bad expression.
"""

from __future__ import annotations

import enum
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftmq.common.errors import InvalidFilterError

MAX_EXPRESSION_CHARS = 4096
MAX_NESTING_DEPTH = 64  # parentheses and NOTs; keeps both parser and evaluator recursion bounded

TAGS_PROPERTY = "TAGS"  # RocketMQ's pseudo-property: the message's tag

# The result of a predicate under SQL's three-valued logic: None is UNKNOWN. A message matches
# only when the whole expression is TRUE, so a missing property never matches, under NOT neither.
Truth = bool | None
Number = int | float


class FilterSyntaxError(InvalidFilterError, ValueError):
    """The filter expression is malformed: the caller's fault (the broker answers INVALID_ARGUMENT).

    A typed RaftMQError (INVALID_FILTER), and a ValueError for callers that catch that.
    `position` is the 0-based character offset of the offending token, `expected` says what the
    parser wanted there and `found` what it got.
    """

    def __init__(self, position: int, expected: str, found: str, hint: str = "") -> None:
        message = f"at position {position}: expected {expected}, found {found}"
        if hint:
            message += f" ({hint})"
        super().__init__(
            message, details={"position": str(position), "expected": expected, "found": found}
        )
        self.position = position
        self.expected = expected
        self.found = found


# ---- AST ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Property:
    """A message property by name (case-sensitive); TAGS names the message's tag."""

    name: str


@dataclass(frozen=True, slots=True)
class Literal:
    value: str | int | float | bool


Operand = Property | Literal


class CompareOp(enum.Enum):
    EQ = "="
    NE = "<>"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


class CompareMode(enum.Enum):
    """How both sides are read, fixed at compile time by the literal in the comparison."""

    NUMBER = "number"
    STRING = "string"
    BOOLEAN = "boolean"


class MatchKind(enum.Enum):
    CONTAINS = "CONTAINS"
    STARTSWITH = "STARTSWITH"
    ENDSWITH = "ENDSWITH"


@dataclass(frozen=True, slots=True)
class Constant:
    value: bool


@dataclass(frozen=True, slots=True)
class Compare:
    op: CompareOp
    mode: CompareMode
    left: Operand
    right: Operand


@dataclass(frozen=True, slots=True)
class Between:
    operand: Operand
    low: Operand
    high: Operand
    negated: bool


@dataclass(frozen=True, slots=True)
class InList:
    prop: Property
    values: frozenset[str]
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    prop: Property
    negated: bool


@dataclass(frozen=True, slots=True)
class StringMatch:
    kind: MatchKind
    prop: Property
    pattern: str
    negated: bool


@dataclass(frozen=True, slots=True)
class Not:
    term: Node


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Node, ...]  # flattened, so a long chain never deepens recursion


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Node, ...]


Node = Constant | Compare | Between | InList | IsNull | StringMatch | Not | And | Or


# ---- tokenizer ---------------------------------------------------------------------------------


class _Kind(enum.Enum):
    IDENT = "identifier"
    KEYWORD = "keyword"
    STRING = "string"
    NUMBER = "number"
    OP = "operator"
    SIGN = "sign"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    END = "end of expression"


_KEYWORDS = frozenset(
    {
        "AND",
        "OR",
        "NOT",
        "BETWEEN",
        "IN",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "CONTAINS",
        "STARTSWITH",
        "ENDSWITH",
        "LIKE",  # reserved so that it gets a clear "not supported" instead of a confusing error
    }
)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Kind
    text: str  # keywords upper-cased; strings unescaped
    pos: int
    number: Number = 0

    def describe(self) -> str:
        if self.kind is _Kind.END:
            return "end of expression"
        if self.kind is _Kind.STRING:
            return f"string {_quote(self.text)}"
        return repr(self.text)


_IDENT_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.]*")
# A number literal; a letter right after it ("3abc") is refused rather than read as two tokens.
_NUMBER_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_PROPERTY_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_WHITESPACE = " \t\r\n\f"
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">")


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _parse_number(text: str) -> Number | None:
    """A number as RocketMQ reads one (decimal int or float, ASCII digits), else None."""
    try:
        if "." in text or "e" in text or "E" in text:
            return float(text)
        return int(text)
    except ValueError:  # an int beyond Python's digit limit: not a number we compare
        return None


def _tokenize(expr: str) -> Iterator[_Token]:
    i, n = 0, len(expr)
    while True:
        while i < n and expr[i] in _WHITESPACE:
            i += 1
        if i >= n:
            yield _Token(_Kind.END, "", n)
            return
        c = expr[i]
        if c == "'":
            start, i, parts = i, i + 1, []
            while True:
                j = expr.find("'", i)
                if j < 0:
                    raise FilterSyntaxError(
                        start, "a closing quote for the string", "end of expression"
                    )
                parts.append(expr[i:j])
                if j + 1 < n and expr[j + 1] == "'":  # '' is an escaped quote
                    parts.append("'")
                    i = j + 2
                    continue
                i = j + 1
                break
            yield _Token(_Kind.STRING, "".join(parts), start)
        elif c.isascii() and (c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit())):
            m = _NUMBER_RE.match(expr, i)
            assert m is not None
            end = m.end()
            if end < n and (expr[end].isalnum() or expr[end] in "_$."):
                raise FilterSyntaxError(i, "a number", repr(expr[i : end + 1]))
            value = _parse_number(m.group())
            if value is None:
                raise FilterSyntaxError(i, "a number", repr(m.group()), "too many digits")
            yield _Token(_Kind.NUMBER, m.group(), i, value)
            i = end
        elif c.isascii() and (c.isalpha() or c in "_$"):
            m = _IDENT_RE.match(expr, i)
            assert m is not None
            word = m.group()
            if word.upper() in _KEYWORDS:
                yield _Token(_Kind.KEYWORD, word.upper(), i)
            else:
                yield _Token(_Kind.IDENT, word, i)
            i = m.end()
        elif c == "(":
            yield _Token(_Kind.LPAREN, c, i)
            i += 1
        elif c == ")":
            yield _Token(_Kind.RPAREN, c, i)
            i += 1
        elif c == ",":
            yield _Token(_Kind.COMMA, c, i)
            i += 1
        elif c in "+-":
            yield _Token(_Kind.SIGN, c, i)
            i += 1
        else:
            for op in _OPERATORS:
                if expr.startswith(op, i):
                    yield _Token(_Kind.OP, op, i)
                    i += len(op)
                    break
            else:
                hint = ""
                if expr.startswith("!=", i):
                    hint = "SQL92 writes 'not equal' as <>"
                elif c == '"':
                    hint = "string literals use single quotes"
                raise FilterSyntaxError(i, "an identifier, literal or operator", repr(c), hint)


# ---- parser ------------------------------------------------------------------------------------

_COMPARE_OPS = {op.value: op for op in CompareOp}
_ORDERING_OPS = frozenset({CompareOp.LT, CompareOp.LE, CompareOp.GT, CompareOp.GE})
_MATCH_KINDS = {k.value: k for k in MatchKind}


class _Parser:
    """One use per expression. Grammar (keywords case-insensitive):

    or        := and (OR and)*
    and       := not (AND not)*
    not       := NOT not | '(' or ')' | TRUE | FALSE | predicate
    predicate := operand cmp_op operand
               | operand [NOT] BETWEEN operand AND operand
               | property [NOT] IN '(' string (',' string)* ')'
               | property IS [NOT] NULL
               | property [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string
    operand   := identifier | string | [+|-] number | TRUE | FALSE
    """

    def __init__(self, expr: str) -> None:
        self._tokens = list(_tokenize(expr))
        self._i = 0
        self._depth = 0

    def parse(self) -> Node:
        node = self._or()
        tok = self._peek()
        if tok.kind is not _Kind.END:
            raise FilterSyntaxError(tok.pos, "AND, OR or end of expression", tok.describe())
        return node

    # -- token helpers

    def _peek(self, ahead: int = 0) -> _Token:
        return self._tokens[min(self._i + ahead, len(self._tokens) - 1)]

    def _next(self) -> _Token:
        tok = self._peek()
        if tok.kind is not _Kind.END:
            self._i += 1
        return tok

    def _is_keyword(self, word: str, ahead: int = 0) -> bool:
        tok = self._peek(ahead)
        return tok.kind is _Kind.KEYWORD and tok.text == word

    def _expect_keyword(self, word: str) -> _Token:
        tok = self._next()
        if tok.kind is not _Kind.KEYWORD or tok.text != word:
            raise FilterSyntaxError(tok.pos, word, tok.describe())
        return tok

    def _enter(self, tok: _Token) -> None:
        self._depth += 1
        if self._depth > MAX_NESTING_DEPTH:
            raise FilterSyntaxError(
                tok.pos,
                f"at most {MAX_NESTING_DEPTH} levels of parentheses and NOT",
                tok.describe(),
            )

    # -- boolean structure

    def _or(self) -> Node:
        terms = [self._and()]
        while self._is_keyword("OR"):
            self._next()
            terms.append(self._and())
        return terms[0] if len(terms) == 1 else Or(tuple(_flatten(terms, Or)))

    def _and(self) -> Node:
        terms = [self._not()]
        while self._is_keyword("AND"):
            self._next()
            terms.append(self._not())
        return terms[0] if len(terms) == 1 else And(tuple(_flatten(terms, And)))

    def _not(self) -> Node:
        tok = self._peek()
        if self._is_keyword("NOT"):
            self._next()
            self._enter(tok)
            node: Node = Not(self._not())
            self._depth -= 1
            return node
        if tok.kind is _Kind.LPAREN:
            self._next()
            self._enter(tok)
            node = self._or()
            close = self._next()
            if close.kind is not _Kind.RPAREN:
                raise FilterSyntaxError(close.pos, "')' or AND/OR", close.describe())
            self._depth -= 1
            return node
        if (self._is_keyword("TRUE") or self._is_keyword("FALSE")) and not (
            self._peek(1).kind is _Kind.OP
            or self._is_keyword("NOT", 1)
            or self._is_keyword("BETWEEN", 1)
        ):
            self._next()
            return Constant(tok.text == "TRUE")
        return self._predicate()

    # -- predicates

    def _predicate(self) -> Node:
        left_tok = self._peek()
        left = self._operand("a property, literal, NOT or '('")
        tok = self._next()
        if tok.kind is _Kind.OP:
            right_tok = self._peek()
            right = self._operand("a property or literal")
            op = _COMPARE_OPS[tok.text]
            return Compare(op, _compare_mode(op, left, left_tok, right, right_tok), left, right)
        negated = False
        if tok.kind is _Kind.KEYWORD and tok.text == "NOT":
            negated = True
            tok = self._next()
            if tok.kind is not _Kind.KEYWORD or tok.text not in (
                "BETWEEN",
                "IN",
                *_MATCH_KINDS,
            ):
                raise FilterSyntaxError(
                    tok.pos, "BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH", tok.describe()
                )
        if tok.kind is not _Kind.KEYWORD:
            raise FilterSyntaxError(
                tok.pos,
                "a comparison operator (= <> < <= > >=), BETWEEN, IN, IS, CONTAINS, STARTSWITH "
                "or ENDSWITH",
                tok.describe(),
            )
        if tok.text == "BETWEEN":
            _require_numeric(left, left_tok, "BETWEEN")
            low_tok = self._peek()
            low = self._operand("a number or property")
            _require_numeric(low, low_tok, "BETWEEN")
            self._expect_keyword("AND")
            high_tok = self._peek()
            high = self._operand("a number or property")
            _require_numeric(high, high_tok, "BETWEEN")
            return Between(left, low, high, negated)
        if tok.text == "LIKE":
            raise FilterSyntaxError(
                tok.pos,
                "a supported operator",
                "LIKE",
                "RocketMQ's SQL92 has no LIKE; use CONTAINS, STARTSWITH or ENDSWITH",
            )
        if tok.text not in ("IN", "IS", *_MATCH_KINDS):
            raise FilterSyntaxError(
                tok.pos,
                "a comparison operator, BETWEEN, IN, IS, CONTAINS, STARTSWITH or ENDSWITH",
                tok.describe(),
            )
        prop = _require_property(left, left_tok, tok.text)
        if tok.text == "IN":
            return InList(prop, self._string_list(), negated)
        if tok.text == "IS":
            is_not = False
            if self._is_keyword("NOT"):
                self._next()
                is_not = True
            self._expect_keyword("NULL")
            return IsNull(prop, is_not)
        pattern = self._next()
        if pattern.kind is not _Kind.STRING:
            raise FilterSyntaxError(pattern.pos, "a string literal", pattern.describe())
        return StringMatch(_MATCH_KINDS[tok.text], prop, pattern.text, negated)

    def _string_list(self) -> frozenset[str]:
        tok = self._next()
        if tok.kind is not _Kind.LPAREN:
            raise FilterSyntaxError(tok.pos, "'(' after IN", tok.describe())
        values = []
        while True:
            tok = self._next()
            if tok.kind is not _Kind.STRING:
                raise FilterSyntaxError(
                    tok.pos, "a string literal", tok.describe(), "IN lists hold strings"
                )
            values.append(tok.text)
            tok = self._next()
            if tok.kind is _Kind.RPAREN:
                return frozenset(values)
            if tok.kind is not _Kind.COMMA:
                raise FilterSyntaxError(tok.pos, "',' or ')'", tok.describe())

    def _operand(self, expected: str) -> Operand:
        tok = self._next()
        if tok.kind is _Kind.IDENT:
            return Property(tok.text)
        if tok.kind is _Kind.STRING:
            return Literal(tok.text)
        if tok.kind is _Kind.NUMBER:
            return Literal(tok.number)
        if tok.kind is _Kind.SIGN:
            num = self._next()
            if num.kind is not _Kind.NUMBER:
                raise FilterSyntaxError(num.pos, f"a number after {tok.text!r}", num.describe())
            return Literal(-num.number if tok.text == "-" else num.number)
        if tok.kind is _Kind.KEYWORD and tok.text in ("TRUE", "FALSE"):
            return Literal(tok.text == "TRUE")
        if tok.kind is _Kind.KEYWORD and tok.text == "NULL":
            raise FilterSyntaxError(
                tok.pos, expected, "NULL", "compare with NULL by 'IS NULL' or 'IS NOT NULL'"
            )
        raise FilterSyntaxError(tok.pos, expected, tok.describe())


def _flatten(terms: list[Node], kind: type[And] | type[Or]) -> Iterator[Node]:
    for t in terms:
        if isinstance(t, kind):
            yield from t.terms
        else:
            yield t


def _literal_type(operand: Operand) -> CompareMode | None:
    if isinstance(operand, Property):
        return None
    if isinstance(operand.value, bool):
        return CompareMode.BOOLEAN
    if isinstance(operand.value, str):
        return CompareMode.STRING
    return CompareMode.NUMBER


def _describe_operand(operand: Operand) -> str:
    if isinstance(operand, Property):
        return operand.name
    if isinstance(operand.value, bool):
        return "TRUE" if operand.value else "FALSE"
    if isinstance(operand.value, str):
        return _quote(operand.value)
    return repr(operand.value)


def _require_numeric(operand: Operand, tok: _Token, what: str) -> None:
    if _literal_type(operand) not in (None, CompareMode.NUMBER):
        raise FilterSyntaxError(
            tok.pos,
            f"a number or property for {what}",
            _describe_operand(operand),
            f"{what} compares numbers",
        )


def _require_property(operand: Operand, tok: _Token, what: str) -> Property:
    if not isinstance(operand, Property):
        raise FilterSyntaxError(
            tok.pos, f"a property name before {what}", _describe_operand(operand)
        )
    return operand


def _compare_mode(
    op: CompareOp, left: Operand, left_tok: _Token, right: Operand, right_tok: _Token
) -> CompareMode:
    """RocketMQ's rules: ordering compares numbers only; = and <> compare like with like."""
    if op in _ORDERING_OPS:
        _require_numeric(left, left_tok, op.value)
        _require_numeric(right, right_tok, op.value)
        return CompareMode.NUMBER
    lt, rt = _literal_type(left), _literal_type(right)
    if lt is not None and rt is not None and lt is not rt:
        raise FilterSyntaxError(
            right_tok.pos,
            f"a {lt.value} to compare with {_describe_operand(left)}",
            _describe_operand(right),
        )
    # Two properties compare as strings: every property value is a string.
    return lt or rt or CompareMode.STRING


# ---- evaluation --------------------------------------------------------------------------------

_Eval = Callable[[Mapping[str, str], str | None], Truth]
_Getter = Callable[[Mapping[str, str], str | None], object]

_OP_FUNCS: dict[CompareOp, Callable[[Any, Any], bool]] = {
    CompareOp.EQ: operator.eq,
    CompareOp.NE: operator.ne,
    CompareOp.LT: operator.lt,
    CompareOp.LE: operator.le,
    CompareOp.GT: operator.gt,
    CompareOp.GE: operator.ge,
}

_MATCH_FUNCS: dict[MatchKind, Callable[[str, str], bool]] = {
    MatchKind.CONTAINS: lambda value, pattern: pattern in value,
    MatchKind.STARTSWITH: lambda value, pattern: value.startswith(pattern),
    MatchKind.ENDSWITH: lambda value, pattern: value.endswith(pattern),
}


def _property_value(name: str, props: Mapping[str, str], tag: str | None) -> str | None:
    if name == TAGS_PROPERTY and tag is not None:
        return tag
    return props.get(name)


def property_number(value: str) -> Number | None:
    """A property value read as a number (decimal int or float), or None when it is not one."""
    if not _PROPERTY_NUMBER_RE.fullmatch(value):
        return None
    return _parse_number(value)


def _property_boolean(value: str) -> bool | None:
    lowered = value.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def _getter(operand: Operand, mode: CompareMode) -> _Getter:
    """Reads one side in the comparison's mode; None (UNKNOWN) when missing or of another type."""
    if isinstance(operand, Literal):
        value = operand.value
        return lambda props, tag: value
    name = operand.name
    if mode is CompareMode.STRING:
        return lambda props, tag: _property_value(name, props, tag)
    convert: Callable[[str], object] = (
        property_number if mode is CompareMode.NUMBER else _property_boolean
    )

    def get(props: Mapping[str, str], tag: str | None) -> object:
        raw = _property_value(name, props, tag)
        return None if raw is None else convert(raw)

    return get


def _compile(node: Node) -> _Eval:
    if isinstance(node, Constant):
        const = node.value
        return lambda props, tag: const
    if isinstance(node, Compare):
        return _compile_compare(node.op, node.mode, node.left, node.right)
    if isinstance(node, Between):
        low = _compile_compare(CompareOp.GE, CompareMode.NUMBER, node.operand, node.low)
        high = _compile_compare(CompareOp.LE, CompareMode.NUMBER, node.operand, node.high)
        return _negate(_and((low, high))) if node.negated else _and((low, high))
    if isinstance(node, InList):
        name, values = node.prop.name, node.values

        def in_list(props: Mapping[str, str], tag: str | None) -> Truth:
            value = _property_value(name, props, tag)
            return None if value is None else value in values

        return _negate(in_list) if node.negated else in_list
    if isinstance(node, IsNull):
        name, is_not = node.prop.name, node.negated
        return lambda props, tag: (_property_value(name, props, tag) is None) != is_not
    if isinstance(node, StringMatch):
        name, pattern = node.prop.name, node.pattern
        method = _MATCH_FUNCS[node.kind]

        def match(props: Mapping[str, str], tag: str | None) -> Truth:
            value = _property_value(name, props, tag)
            return None if value is None else method(value, pattern)

        return _negate(match) if node.negated else match
    if isinstance(node, Not):
        return _negate(_compile(node.term))
    if isinstance(node, And):
        return _and(tuple(_compile(t) for t in node.terms))
    return _or(tuple(_compile(t) for t in node.terms))


def _compile_compare(op: CompareOp, mode: CompareMode, left: Operand, right: Operand) -> _Eval:
    get_left, get_right, func = _getter(left, mode), _getter(right, mode), _OP_FUNCS[op]

    def compare(props: Mapping[str, str], tag: str | None) -> Truth:
        lv = get_left(props, tag)
        if lv is None:
            return None
        rv = get_right(props, tag)
        if rv is None:
            return None
        return func(lv, rv)

    return compare


def _negate(inner: _Eval) -> _Eval:
    def negated(props: Mapping[str, str], tag: str | None) -> Truth:
        value = inner(props, tag)
        return None if value is None else not value

    return negated


def _and(terms: tuple[_Eval, ...]) -> _Eval:
    def conjunction(props: Mapping[str, str], tag: str | None) -> Truth:
        result: Truth = True
        for term in terms:
            value = term(props, tag)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return conjunction


def _or(terms: tuple[_Eval, ...]) -> _Eval:
    def disjunction(props: Mapping[str, str], tag: str | None) -> Truth:
        result: Truth = False
        for term in terms:
            value = term(props, tag)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return disjunction


def _referenced(node: Node) -> Iterator[str]:
    if isinstance(node, Compare):
        operands: tuple[Operand, ...] = (node.left, node.right)
    elif isinstance(node, Between):
        operands = (node.operand, node.low, node.high)
    elif isinstance(node, InList | IsNull | StringMatch):
        operands = (node.prop,)
    elif isinstance(node, Not):
        operands = ()
        yield from _referenced(node.term)
    elif isinstance(node, And | Or):
        operands = ()
        for t in node.terms:
            yield from _referenced(t)
    else:
        operands = ()
    for o in operands:
        if isinstance(o, Property):
            yield o.name


# ---- public API --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filter:
    """A compiled SQL92 filter. Safe to share between threads: it holds no mutable state."""

    expression: str
    ast: Node
    properties: frozenset[str]  # every property name the expression reads (TAGS included)
    _evaluate: _Eval = field(repr=False, compare=False)

    def evaluate(self, properties: Mapping[str, str], tag: str | None = None) -> Truth:
        """TRUE, FALSE or None for UNKNOWN (a missing property or a value of the wrong type)."""
        return self._evaluate(properties, tag)

    def matches(self, properties: Mapping[str, str], tag: str | None = None) -> bool:
        """Whether the message passes: the expression is TRUE. `tag`, when given, is the value
        of the TAGS pseudo-property; otherwise a "TAGS" entry of `properties` is used."""
        return self._evaluate(properties, tag) is True


def compile_filter(expression: str) -> Filter:
    """Parses and compiles `expression`; raises FilterSyntaxError if it is not valid SQL92."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise FilterSyntaxError(
            MAX_EXPRESSION_CHARS,
            f"at most {MAX_EXPRESSION_CHARS} characters",
            f"{len(expression)} characters",
        )
    ast = _Parser(expression).parse()
    return Filter(expression, ast, frozenset(_referenced(ast)), _compile(ast))
