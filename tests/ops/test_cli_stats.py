"""Resource reports against a real cluster (NameServer + one broker group of three processes):
traffic at known rates gives per-minute counts equal to what was sent and consumed, through
`Admin` and `raftmq stats` (table, JSON, PNG).

The issue asks for 10 minutes of traffic within 1%; this runs ~12 s of traffic in two rate
phases (40 and 10 messages/s) and checks every minute's count EXACTLY: each batch's minute is
known from the client's clock before and after the send (same machine as the brokers), and no
batch is sent within 0.7 s of a minute boundary, so whether or not the run crosses a minute the
expected counts are exact."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.ops import cli, cli_data
from raftmq.ops.dashboard.app import Dashboard, Request
from tests.harness.procs import Cluster, start_cluster, wait_until

MINUTE = 60.0
GUARD_S = 0.7  # no batch this close to a minute boundary
TOPIC = "stats-t"
GROUP = "stats-g"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cli-stats"), groups=("broker-a",), namesrvs=1)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_data.console, "width", 250)


def minute_of(t: float) -> int:
    return int(t // MINUTE) * 60_000


def away_from_boundary() -> None:
    """Sleep past the next minute boundary if it is within GUARD_S (either side)."""
    into = time.time() % MINUTE
    if into > MINUTE - GUARD_S:
        time.sleep(MINUTE - into + GUARD_S)
    elif into < GUARD_S:
        time.sleep(GUARD_S - into)


def test_known_rates_give_exact_per_minute_counts(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with Admin(cluster.namesrv) as admin:
        # The cluster fixture returns once the processes started, maybe before an election.
        wait_until(lambda: admin.create_topic(TOPIC, queues=2) or True, 30, "a leader to create")
        wait_until(lambda: admin.route(TOPIC), 30, "the topic's route")
    sent: dict[int, int] = {}
    with Producer(cluster.namesrv) as producer:
        for per_batch, seconds in ((4, 6.0), (1, 6.0)):  # 40/s then 10/s: batches every 0.1 s
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                away_from_boundary()
                before = time.time()
                producer.send_batch(TOPIC, [b"m%d" % i for i in range(per_batch)])
                after = time.time()
                assert minute_of(before) == minute_of(after), "a send took past the guard"
                sent[minute_of(before)] = sent.get(minute_of(before), 0) + per_batch
                time.sleep(max(0.0, 0.1 - (after - before)))
    total = sum(sent.values())
    assert total > 60

    # The consumer reads everything inside one minute (it waits for room), then stops.
    if time.time() % MINUTE > MINUTE - 15:
        time.sleep(MINUTE - time.time() % MINUTE + GUARD_S)
    consume_minute = minute_of(time.time())
    got = 0
    with PullConsumer(cluster.namesrv, GROUP, start_from=StartFrom.EARLIEST) as consumer:
        consumer.subscribe(TOPIC)
        deadline = time.monotonic() + 10
        while got < total and time.monotonic() < deadline:
            got += len(consumer.poll(timeout_ms=500))
    assert got == total
    assert minute_of(time.time()) == consume_minute, "consumption crossed a minute"

    with Admin(cluster.namesrv) as admin:
        produced = admin.topic_stats(TOPIC, since_ms=10 * 60_000)
        consumed = admin.group_stats(GROUP, since_ms=10 * 60_000)
    assert not produced.unanswered and not consumed.unanswered
    [p] = produced.series
    assert (p.topic, p.group) == (TOPIC, "")
    got_per_minute = {m: c for m, c in zip(produced.minute_starts(), p.counts, strict=True) if c}
    assert got_per_minute == sent
    [c] = consumed.series
    assert (c.topic, c.group) == (TOPIC, GROUP)
    got_consumed = {m: n for m, n in zip(consumed.minute_starts(), c.counts, strict=True) if n}
    assert got_consumed == {consume_minute: total}

    # The command: a table with TPS and a sparkline, JSON equal to the Admin's, a PNG.
    png = tmp_path / "rates.png"
    code = cli.main(
        ["--namesrv", cluster.namesrv, "stats", "topic", TOPIC, "--since", "10m",
         "--per-minute", "--plot", str(png)]
    )  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert TOPIC in out and "avg TPS" in out and str(total) in out, out
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█"), out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    code = cli.main(["--namesrv", cluster.namesrv, "stats", "group", GROUP, "--since", "10m",
                     "--json"])  # fmt: skip
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    [series] = doc["series"]
    assert series["total"] == total and series["group"] == GROUP

    # The dashboard's reports page shows the same totals and a chart per series.
    with Admin(cluster.namesrv) as admin:
        d = Dashboard(admin)
        assert "raftmq.ops.dashboard.reports" in d.plugins and ("/reports", "Reports") in d.nav()
        resp = d.handle(Request("GET", "/reports", {"topic": TOPIC, "since": "10m"}))
        assert resp.status == 200 and f">{total}<" in resp.body and 'id="chart-0"' in resp.body
        resp = d.handle(Request("GET", "/reports", {"group": GROUP, "since": "10m"}))
        assert resp.status == 200 and f">{total}<" in resp.body, resp.body
        resp = d.handle(Request("GET", "/reports", {"topic": TOPIC, "since": "soon"}))
        assert resp.status == 400 and "positive number" in resp.body


def test_bad_input_is_a_sentence(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--namesrv", cluster.namesrv, "stats", "topic", TOPIC, "--since", "soon"])
    _, err = capsys.readouterr()
    assert code != 0 and "positive number" in err and "Traceback" not in err
    code = cli.main(["--namesrv", cluster.namesrv, "stats", "group", "bad group!"])
    _, err = capsys.readouterr()
    assert code != 0 and "Traceback" not in err, err
