"""A consumer's subscription filter checked once, where it is given (a consumer's constructor, the
CLI, the Spark options), so a bad expression fails there and not as an empty poll.

Pure: parses and raises InvalidFilterError naming the expression, the position and the fix.
"""

from __future__ import annotations

from raftmq.common.errors import InvalidFilterError
from raftmq.common.filter.sql92 import FilterSyntaxError, compile_filter
from raftmq.common.filter.tag import SUB_ALL, parse_tag_expression

# Of an expression quoted in an error: a 10 000-character one would bury the message.
SHOWN_CHARS = 200


def _quoted(expression: str) -> str:
    """`expression` as the error quotes it: repr'd, and cut with its length said when long."""
    if len(expression) <= SHOWN_CHARS:
        return repr(expression)
    return f"{expression[:SHOWN_CHARS]!r}... ({len(expression)} characters)"


SQL92_HELP = (
    "RocketMQ SQL92 has =, <>, <, <=, >, >=, BETWEEN a AND b, IN ('x', 'y'), IS [NOT] NULL, "
    "[NOT] LIKE, AND, OR, NOT and parentheses; strings in single quotes, e.g. "
    "\"region = 'eu' AND TAGS IN ('TagA', 'TagB')\""
)


def check_subscription(tag_expression: str | None, sql_expression: str | None) -> None:
    """Refuse a tag expression or an SQL92 expression that does not parse, and both together
    (the broker applies only one: the SQL filter, which can test the tag itself)."""
    tags = (tag_expression or "").strip()
    if sql_expression:
        if tags and tags != SUB_ALL:
            raise InvalidFilterError(
                f"both a tag expression ({_quoted(tags)}) and an SQL92 expression "
                f"({_quoted(sql_expression)}) were given; a subscription has one filter: use the "
                "SQL92 expression alone and test the tag in it (TAGS IN ('TagA', 'TagB')), or the "
                "tag expression alone",
                details={"tag_expression": tag_expression or "", "sql_expression": sql_expression},
            )
        try:
            compile_filter(sql_expression)
        except FilterSyntaxError as exc:
            raise InvalidFilterError(
                f"SQL92 filter {_quoted(sql_expression)} is invalid {exc.message}; {SQL92_HELP}",
                details={**exc.details, "sql_expression": sql_expression},
            ) from None
        return
    try:
        parse_tag_expression(tag_expression, strict=True)
    except FilterSyntaxError as exc:
        raise InvalidFilterError(
            f"tag expression {_quoted(tag_expression or '')} is invalid {exc.message}; a tag "
            "expression is '*' (every message) or tags joined by '||', e.g. 'TagA || TagB'",
            details={**exc.details, "tag_expression": tag_expression or ""},
        ) from None
