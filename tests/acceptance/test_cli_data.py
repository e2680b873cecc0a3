"""The `raftmq` data subcommands (client/cli_data.py through client/cli.py's parser) against the
real cluster: topics, produce with a progress bar, consume, group lag and reset, message lookups,
and one clear line (no traceback) for every typed error."""

from __future__ import annotations

import re

import pytest

from raftmq.ops import cli, cli_data
from tests.harness.procs import Cluster, wait_until

MSG_ID = re.compile(r"broker-[ab]-[0-9A-F]{32}")


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--namesrv", cluster.namesrv, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def total_lag(table: str) -> int:
    row = next(line for line in table.splitlines() if "total" in line)
    return int(re.findall(r"\d+", row)[-1])


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tables fold long cells at the 80 columns of a non-terminal; ids must stay whole here.
    monkeypatch.setattr(cli_data.console, "width", 250)
    monkeypatch.setattr(cli.err_console, "width", 400)


def test_topic_produce_consume_lag_reset_and_lookup(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, capsys, "topic", "create", "cli-topic", "--queues", "2")
    assert code == 0 and "created on broker-a, broker-b" in out

    def routed() -> bool:
        code, out, _ = run(cluster, capsys, "topic", "route", "cli-topic")
        return code == 0 and "broker-a" in out and "broker-b" in out

    wait_until(routed, 30, "the route of cli-topic")
    code, out, _ = run(cluster, capsys, "topic", "list")
    assert code == 0 and "cli-topic" in out and "2/2" in out

    args = ["produce", "cli-topic", "--count", "200", "--size", "50", "--batch", "20"]
    code, out, _ = run(cluster, capsys, *args, "--key", "kk")
    assert code == 0 and "200 messages" in out and "acknowledged" in out
    code, out, _ = run(
        cluster, capsys, "produce", "cli-topic", "--message", "hello", "--key", "hk", "--show-ids"
    )
    assert code == 0
    ids = MSG_ID.findall(out)
    assert len(ids) == 1

    code, out, _ = run(
        cluster,
        capsys,
        "consume",
        "cli-topic",
        "--group",
        "g-cli",
        "--from-beginning",
        "--max",
        "201",
        "--timeout",
        "60",
    )
    assert code == 0 and "201 messages" in out and "consumed by group g-cli" in out
    assert "'hello'" in out, "rows show the bodies"

    code, out, _ = run(cluster, capsys, "group", "lag", "g-cli", "--topic", "cli-topic")
    assert code == 0 and total_lag(out) == 0, out
    code, out, _ = run(
        cluster, capsys, "group", "reset", "g-cli", "--topic", "cli-topic", "--to-time", "0"
    )
    assert code == 0 and "cli-topic@broker-a#0" in out
    code, out, _ = run(cluster, capsys, "group", "lag", "g-cli", "--topic", "cli-topic")
    assert code == 0 and total_lag(out) == 201, "after a reset to the start all is lag again"

    code, out, _ = run(cluster, capsys, "message", "get", "--id", ids[0])
    assert code == 0 and ids[0] in out and "hello" in out
    code, out, _ = run(cluster, capsys, "message", "get", "--key", "hk", "--topic", "cli-topic")
    assert code == 0 and ids[0] in out

    code, out, _ = run(cluster, capsys, "topic", "delete", "cli-topic")
    assert code == 0 and "deleted from broker-a, broker-b" in out


@pytest.mark.parametrize(
    ("argv", "code_name", "text"),
    [
        (["produce", "no-such-topic"], "TOPIC_NOT_FOUND", "no-such-topic"),
        (["topic", "create", "bad topic!"], "INVALID_NAME", "bad topic!"),
        (["message", "get", "--id", "nope"], "INVALID_MESSAGE_ID", "nope"),
        (["group", "reset", "g", "--topic", "t", "--to-time", "yesterday"], "INVALID_ARGUMENT", ""),
        (["consume", "no-such-topic", "--group", "g"], "NO_ROUTE", "no-such-topic"),
    ],
)
def test_typed_errors_are_one_line(
    cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code_name: str,
    text: str,
) -> None:
    code, _, err = run(cluster, capsys, *argv)
    assert code == 1
    assert f"error ({code_name})" in err and text in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_no_namesrv_answering_names_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--namesrv", "127.0.0.1:1", "topic", "list"])
    _, err = capsys.readouterr()
    assert code == 1 and "error (BROKER_UNAVAILABLE)" in err and "127.0.0.1:1" in err
