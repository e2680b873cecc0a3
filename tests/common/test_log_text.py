"""User content in log lines (issue 26): every record's message is one printable line, whatever
a value holds (newlines that would forge a record, ESC that would drive the terminal of whoever
tails the log), in a real broker process and in the formatter itself (common/log_text.py)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.log_text import PrintableFormatter, configure_logging, printable
from tests.harness.local_cluster import free_ports
from tests.harness.procs import GroupLayout, broker_procs

FORGED = "2026-11-27 00:00:00,000 ERROR forged"
NASTY = f"n9\n{FORGED}\x1b[31m\x85[bold]x[/]"


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("t", logging.WARNING, __file__, 1, msg, args, None)


@settings(deadline=None)  # a loaded CI machine is no bug
@given(st.text())
def test_any_value_leaves_one_printable_line(value: str) -> None:
    line = PrintableFormatter("%(levelname)s %(message)s").format(record("e group=%s x=1", value))
    assert line == f"WARNING e group={printable(value)} x=1"
    assert line.isprintable()


def test_a_traceback_stays_as_python_wrote_it() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = logging.LogRecord(
            "t", logging.ERROR, __file__, 1, "e v=%s", ("a\nb",), sys.exc_info()
        )
    out = PrintableFormatter("%(message)s").format(rec)
    first, *rest = out.splitlines()
    assert first == "e v=a\\nb" and rest[-1] == "ValueError: boom"


def test_configure_logging_installs_it() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = []
    try:
        buf = io.StringIO()
        configure_logging("INFO", buf)
        logging.getLogger("x").info("e topic=%s", "a\x1b[2Jb")
        assert buf.getvalue().endswith(" INFO x e topic=a\\x1b[2Jb\n")
    finally:
        root.handlers, root.level = saved[0], saved[1]


def test_a_broker_logs_an_odd_file_name_on_one_line(tmp_path: Path) -> None:
    """A file in a broker's journal directory named with a newline, a forged record, ESC and
    NEL (its name is not ours to choose): the broker's warning about it stays one line with
    them escaped (a real broker process; it starts alone, no quorum needed to log)."""
    ports = free_ports(9)
    layout = GroupLayout("g", ports[:3], ports[3:6], ports[6:])
    broker = broker_procs(tmp_path, layout, ["127.0.0.1:1"])[0]
    journal = tmp_path / "g-n0" / "raft" / "journal"
    journal.mkdir(parents=True)
    (journal / NASTY.replace("/", "|")).write_bytes(b"")
    broker.start("broker.started")
    try:
        text = broker.log.read_text()
    finally:
        broker.kill()
    lines = text.splitlines()
    assert not [x for x in lines if x.startswith(FORGED)], lines
    (line,) = [x for x in lines if "journal.unknown_file" in x]
    assert printable(NASTY.replace("/", "|")) in line and line.isprintable(), line
