"""How the `raftmq` command prints to a terminal: its consoles (rich markup for our own texts,
emoji codes off) and `literal`, the one way user content (bodies, keys, tags, properties, names,
a peer's error text) enters a printed line. Nothing here may let user content be read as markup,
an emoji code or a terminal control sequence."""

from __future__ import annotations

import codecs
import os
import re

from rich.console import Console

from raftmq.common.log_text import printable

# Columns of a table written to a pipe or a file: rich's default there is 80, which cut a
# ten-column table's groups and addresses to "brok…" and "127.…" in scripts and CI logs.
PIPE_COLUMNS = 200


def make_console(*, stderr: bool = False) -> Console:
    """A console of the CLI: emoji codes off, since `:name:` in a body would become a picture
    (rich reads them outside markup too); PIPE_COLUMNS wide when not on a terminal, unless
    COLUMNS says otherwise."""
    console = Console(stderr=stderr, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_COLUMNS
    return console


def decoded(value: str | bytes, limit: int | None = None) -> str:
    """A body as text: UTF-8, each invalid byte as its `\\xNN` escape (never a silent U+FFFD);
    `limit` cuts the bytes first."""
    if isinstance(value, bytes):
        if limit is None:
            return value.decode("utf-8", "backslashreplace")
        # not final: a character the cut splits is dropped, not shown as stray escapes
        decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        return str(decoder.decode(value[:limit], final=False))
    return value if limit is None else value[:limit]


def literal(value: str | bytes, limit: int | None = None) -> str:
    """User content ready for a rich markup string or a table cell: decoded, control characters
    escaped, then markup escaped so that `[/]`, `[bold red]`, `[link=...]`, `[word]` and any run
    of backslashes print as written, alone or inside our own tags.

    rich's `escape` is not enough (the property test in tests/ops/test_terminal_text.py found
    both): rich's renderer also turns `\\[` into `[` outside tags, and a final backslash
    would escape the tag that follows it. So each `[` gets the backslashes rich's parser takes
    away: before a tag-like `[x...]` (RE_TAGS), its k backslashes doubled and one more; before
    any other `[`, one more; backslashes at the end doubled and closed by an empty style."""
    text = printable(decoded(value, limit))

    def bracket(m: re.Match[str]) -> str:
        k = len(m.group(1))
        tag_like = _TAG_BODY.match(text, m.end()) is not None
        return "\\" * (2 * k + 1 if tag_like else k + 1) + "["

    body = text.rstrip("\\")
    out = _BRACKET.sub(bracket, body)
    trailing = len(text) - len(body)
    return out + "\\" * (2 * trailing) + "[none][/none]" if trailing else out


# What rich's markup parser (rich.markup.RE_TAGS) reads as a tag after a `[`.
_TAG_BODY = re.compile(r"[a-z#/@][^\[]*?\]")
_BRACKET = re.compile(r"(\\*)\[")
