"""RocketMQ tag expressions (`*`, `tagA || tagB`) and the stable 64-bit tag hash.

Pure: parses an expression into a TagFilter and hashes tags. `tag_hash` is the value the broker's
ConsumeQueue row stores for every message, so it must never change for a given tag.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from raftmq.common.filter.sql92 import MAX_EXPRESSION_CHARS, FilterSyntaxError

SUB_ALL = "*"
TAG_SEPARATOR = "||"
NO_TAG_HASH = 0  # what a message without a tag stores (as RocketMQ's tagsCode of 0)


def tag_hash(tag: str | None) -> int:
    """The unsigned 64-bit hash of a tag that the broker's ConsumeQueue row stores, exactly: the
    8-byte BLAKE2b digest of the tag's UTF-8, big-endian. None or "" (no tag) gives NO_TAG_HASH.

    Stable across processes and versions (unlike `hash()`): replicas and stores written by older
    versions compare it, so changing this function is a data-format change.
    """
    if not tag:
        return NO_TAG_HASH
    digest = hashlib.blake2b(tag.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed tag expression. `tags` and `hash_codes` are None when it selects every message.

    The broker checks `matches_hash` against the ConsumeQueue row (cheap, may pass a colliding
    tag); the consumer checks `matches` against the real tag, as RocketMQ does.
    """

    expression: str
    tags: frozenset[str] | None
    hash_codes: frozenset[int] | None

    @property
    def is_all(self) -> bool:
        return self.tags is None

    def matches(self, tag: str | None) -> bool:
        if self.tags is None:
            return True
        return tag is not None and tag in self.tags

    def matches_hash(self, code: int) -> bool:
        if self.hash_codes is None:
            return True
        return code in self.hash_codes


MATCH_ALL = TagFilter(SUB_ALL, None, None)


def parse_tag_expression(expression: str | None, *, strict: bool = False) -> TagFilter:
    """Parses `*`, `""`, None (every message) or `tagA || tagB || ...` (whitespace around tags is
    ignored). A `*` among the alternatives selects every message too. Raises FilterSyntaxError
    (an InvalidFilterError) for an expression that names no tag (such as `||`), uses an operator
    tag expressions do not have (`&&`, a single `|`: no tag can hold '|'), or is longer than the
    SQL92 limit. An empty alternative (`TagA ||`) is skipped, as RocketMQ's broker does, unless
    `strict` (what a consumer is built with: there it is a typo to report)."""
    if expression is None:
        return MATCH_ALL
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise FilterSyntaxError(
            MAX_EXPRESSION_CHARS,
            f"at most {MAX_EXPRESSION_CHARS} characters",
            f"{len(expression)} characters",
        )
    if not expression.strip():
        return TagFilter(expression, None, None)
    tags = _split_tags(expression, strict)
    if SUB_ALL in tags:
        return TagFilter(expression, None, None)
    return TagFilter(expression, tags, frozenset(tag_hash(t) for t in tags))


def _split_tags(expression: str, strict: bool) -> frozenset[str]:
    """The tags of `tagA || tagB`, refusing what RocketMQ's tag expressions cannot say."""
    amp = expression.find("&&")
    if amp >= 0:
        raise FilterSyntaxError(
            amp,
            "'||' or a tag",
            "'&&'",
            "tag expressions only have '||' (a message has one tag, so 'TagA && TagB' matches "
            "nothing); to combine conditions use an SQL92 filter such as "
            "\"TAGS = 'TagA' AND region = 'eu'\"",
        )
    tags: list[str] = []
    pos = 0
    for part in expression.split(TAG_SEPARATOR):
        tag = part.strip()
        at = pos + (len(part) - len(part.lstrip()))
        if "|" in tag:
            bar = pos + part.index("|")
            raise FilterSyntaxError(bar, "'||' between tags", "a single '|'", "write TagA || TagB")
        if not tag:
            if not expression.replace("|", "").strip():
                raise FilterSyntaxError(
                    0, "a tag or '*'", repr(expression), "name a tag, or use '*' for every tag"
                )
            if not strict:
                pos += len(part) + len(TAG_SEPARATOR)
                continue
            where = "before" if not tags else "after"
            raise FilterSyntaxError(
                at,
                f"a tag {where} '||'",
                "nothing",
                "remove the dangling '||' or name a tag there, e.g. 'TagA || TagB'",
            )
        tags.append(tag)
        pos += len(part) + len(TAG_SEPARATOR)
    return frozenset(tags)
