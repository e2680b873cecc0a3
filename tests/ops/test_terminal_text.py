"""ops/terminal_text.py: whatever a user's content holds, the terminal shows exactly its
printable form (markup, emoji codes and backslashes as written, control characters as escapes,
invalid UTF-8 as \\xNN); and the queue-shrink verdict of client/queue_shrink.py (pure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.queue_shrink import stranded
from raftmq.common.log_text import printable
from raftmq.common.types import QueueRef
from raftmq.ops.terminal_text import decoded, literal, make_console

MARKUP_BITS = ["[", "]", "/", "\\", "bold", "red", "link=x", ":", "smile", "\x1b", "\n", "é", "[/]"]
ROOT = Path(__file__).resolve().parents[2]
TEXT = st.lists(st.sampled_from(MARKUP_BITS) | st.text(max_size=3), max_size=12).map("".join)


def shown(markup: str) -> str:
    console = make_console()
    console.width = 10_000
    with console.capture() as out:
        console.print(markup, soft_wrap=True, highlight=False, end="")
    return out.get()


@given(TEXT)
def test_user_text_prints_as_its_printable_form(text: str) -> None:
    assert shown(literal(text)) == printable(text)
    assert shown(f"[green]{literal(text)}[/]") == printable(text), "inside our own markup too"


@given(st.binary(max_size=24))
def test_a_body_prints_as_its_bytes(body: bytes) -> None:
    out = shown(literal(body))
    assert out == printable(decoded(body))
    assert "\ufffd" not in out or "\ufffd".encode() in body, "no silent replacement character"


def test_a_cut_never_splits_a_character() -> None:
    assert decoded("né".encode(), 2) == "n"  # the cut falls inside é: dropped, not \xc3
    assert decoded(b"\xff\xfe", 1) == "\\xff"


Q = [QueueRef("t", "b", i) for i in range(4)]


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=4, max_size=4),
    st.dictionaries(
        st.sampled_from(["g1", "g2", "g3"]),
        st.lists(st.none() | st.integers(0, 60), min_size=4, max_size=4),
        max_size=3,
    ),
)
def test_a_shrink_strands_what_the_furthest_group_behind_has_not_read(
    ranges: list[tuple[int, int]], groups: dict[str, list[int | None]]
) -> None:
    bounds = {q: (min(a, b), max(a, b)) for q, (a, b) in zip(Q, ranges, strict=True)}
    committed = {g: dict(zip(Q, offs, strict=True)) for g, offs in groups.items()}
    found = {s.queue: s for s in stranded(bounds, committed)}
    for q, (low, high) in bounds.items():
        if not committed:
            want = high - low
        else:
            want = max(
                high - max(low, low if offs[q] is None else offs[q])  # type: ignore[operator]
                for offs in committed.values()
            )
        if want <= 0:
            assert q not in found
        else:
            assert found[q].unconsumed == want
            behind = found[q].groups
            assert (not committed and behind == ()) or all(
                high - max(low, c if (c := committed[g][q]) is not None else low) > 0
                for g in behind
            )


def test_a_table_written_to_a_pipe_is_not_cut_to_80_columns() -> None:
    """`raftmq broker status | cat` showed "brok…" and "127.…": rich's pipe default is 80."""
    code = (
        "from rich.table import Table\n"
        "from raftmq.ops.terminal_text import make_console\n"
        "t = Table()\n"
        "for c in ('group', 'node', 'address', 'role', 'term', 'commit', 'applied',"
        " 'dispatched', 'topics', 'storage'): t.add_column(c)\n"
        "t.add_row('broker-a', 'n0', '127.0.0.1:10911', 'follower', '4', '18', '18', '18', '2',"
        " 'ok')\n"
        "make_console().print(t)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "127.0.0.1:10911" in out and "broker-a" in out and "…" not in out, out
    narrow = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "COLUMNS": "60"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert max(map(len, narrow.splitlines())) <= 60, "COLUMNS still wins"
