"""A consumer's subscription filter checked once, where it is given (a consumer's constructor, the
CLI, the Spark options), so a bad expression fails there and not as an empty poll.

Pure: parses and raises InvalidFilterError naming the expression, the position and the fix.
"""

from __future__ import annotations

from raftmq.common.errors import InvalidFilterError
from raftmq.common.filter.sql92 import FilterSyntaxError, compile_filter
from raftmq.common.filter.tag import SUB_ALL, parse_tag_expression

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
                f"both a tag expression ({tag_expression!r}) and an SQL92 expression "
                f"({sql_expression!r}) were given; a subscription has one filter: use the SQL92 "
                f"expression alone and test the tag in it (TAGS IN ('TagA', 'TagB')), or the tag "
                "expression alone",
                details={"tag_expression": tag_expression or "", "sql_expression": sql_expression},
            )
        try:
            compile_filter(sql_expression)
        except FilterSyntaxError as exc:
            raise InvalidFilterError(
                f"SQL92 filter {sql_expression!r} is invalid {exc.message}; {SQL92_HELP}",
                details={**exc.details, "sql_expression": sql_expression},
            ) from None
        return
    try:
        parse_tag_expression(tag_expression, strict=True)
    except FilterSyntaxError as exc:
        raise InvalidFilterError(
            f"tag expression {tag_expression!r} is invalid {exc.message}; a tag expression is "
            "'*' (every message) or tags joined by '||', e.g. 'TagA || TagB'",
            details={**exc.details, "tag_expression": tag_expression or ""},
        ) from None
