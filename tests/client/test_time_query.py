"""Query by topic and time range (issue 16, item 6) against real processes (one broker group of
three nodes, a NameServer): the Admin API returns exactly the messages stored within the range,
page by page with no repeat and no gap, and `raftmq message list` prints them as a table with a
page token; bad ranges and tokens are clear typed errors. The pure page decision is tested on
an in-memory queue below."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from raftmq.broker.rows import CQRow
from raftmq.broker.time_query import Cursor, page_of
from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from raftmq.common.errors import InvalidArgumentError
from raftmq.ops import cli, cli_data
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "by-time"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("time-query"), (GROUP,), namesrvs=1)
    try:
        c.wait_leaders()
        with Admin(c.namesrv) as admin:
            admin.create_topic(TOPIC, queues=4)
            wait_until(lambda: admin.route(TOPIC).groups, 30, "the topic's route")
        yield c
    finally:
        c.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_time_range_is_exact_and_paged(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Producer(cluster.namesrv) as p:
        for i in range(15):
            p.send(TOPIC, f"before-{i}".encode())
        time.sleep(0.05)
        begin = now_ms()
        inside = {p.send(TOPIC, f"inside-{i}".encode()).msg_id for i in range(53)}
        end = now_ms()
        time.sleep(0.05)
        for i in range(15):
            p.send(TOPIC, f"after-{i}".encode())

    with Admin(cluster.namesrv) as admin:
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            page = admin.messages_by_time(TOPIC, begin, end, page_size=7, page_token=token)
            assert len(page.messages) <= 7
            seen += [m.msg_id for m in page.messages]
            assert all(begin <= m.store_timestamp_ms <= end for m in page.messages)
            assert all(m.body.startswith(b"inside-") for m in page.messages)
            pages += 1
            token = page.next_page_token
            if not token:
                break
        assert len(seen) == len(set(seen)) == 53 and set(seen) == inside
        assert pages >= 8
        assert {m.msg_id for m in admin.iter_messages_by_time(TOPIC, begin, end)} == inside
        # An empty range and a range before everything: no messages, no error.
        assert list(admin.iter_messages_by_time(TOPIC, 1, 2)) == []
        with pytest.raises(InvalidArgumentError, match="before it begins"):
            admin.messages_by_time(TOPIC, end, begin)
        with pytest.raises(InvalidArgumentError, match="page token"):
            admin.messages_by_time(TOPIC, begin, end, page_token="nope")

    monkeypatch.setattr(cli_data.console, "width", 250)
    argv = ["--namesrv", cluster.namesrv, "message", "list", "--topic", TOPIC]
    code = cli.main([*argv, "--from", str(begin), "--to", str(end), "--page-size", "10"])
    out = capsys.readouterr().out
    assert code == 0 and "inside-" in out and "before-" not in out
    assert "10 messages; next page: --page-token" in out
    code = cli.main([*argv, "--from", str(begin), "--to", str(end), "--all"])
    out = capsys.readouterr().out
    assert code == 0 and "53 messages; no more in this range" in out and "after-" not in out
    code = cli.main([*argv, "--from", str(end), "--to", str(begin)])
    captured = capsys.readouterr()
    assert code != 0 and "before it begins" in captured.err and "Traceback" not in captured.err


# ---- the page decision, on an in-memory topic ---------------------------------------------------


@dataclass
class MemRows:
    times: dict[int, list[int]]  # queue id -> store time of each offset

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        return 0, len(self.times[queue_id])

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        ts = self.times[queue_id]
        return next((i for i, t in enumerate(ts) if t >= timestamp_ms), len(ts))

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[CQRow]:
        ts = self.times[queue_id]
        return [
            CQRow(topic, queue_id, o, 1, 0, o, 0, 1, 0, ts[o])
            for o in range(offset, min(len(ts), offset + max_count))
        ]


@pytest.mark.parametrize("page_size", [1, 2, 3, 5, 100])
def test_page_of_returns_each_row_in_range_once(page_size: int) -> None:
    rows = MemRows({0: [1, 2, 3, 5, 8, 13], 1: [], 2: [4, 4, 4, 9], 3: [10, 11, 12]})
    got: list[tuple[int, int]] = []
    cursor: Cursor | None = Cursor(0, -1)
    while cursor is not None:
        page = page_of(rows, "t", 4, 3, 10, page_size, cursor)
        assert len(page.rows) <= page_size
        got += [(r.queue_id, r.queue_offset) for r in page.rows]
        cursor = page.next
    want = [(q, o) for q, ts in rows.times.items() for o, t in enumerate(ts) if 3 <= t <= 10]
    assert got == want
