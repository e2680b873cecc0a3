"""How a log line carries user content (topics, groups, keys, client ids and addresses, a
peer's error text): each record's message written one line, every unprintable character as its
Python escape, so a value can neither forge a second record nor drive the terminal of whoever
tails the log. The one `printable` helper (the CLI's `literal` builds on it); no I/O here."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def printable(text: str) -> str:
    """`text` with every unprintable character (newlines, NEL, ESC from a body, an argument or a
    peer) written as its Python escape, so a line stays one line and cannot drive the terminal."""
    if text.isprintable():
        return text  # the usual case, without a copy
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class PrintableFormatter(logging.Formatter):
    """The record's message (our format string with its arguments) made printable; a traceback
    appended after it stays as Python wrote it (our code's frames, several lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def configure_logging(level: int | str, stream: TextIO | None = None) -> None:
    """The process's root logger: one handler on `stream` (stderr) with PrintableFormatter."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(PrintableFormatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
