"""`raftmq cluster status` shows a node whose disk refuses writes, and only then a disk column."""

from __future__ import annotations

from rich.console import Console

from raftmq.ops.cli_cluster import status_table
from raftmq.ops.cluster_runner import NodeStatus


def render(rows: list[NodeStatus]) -> str:
    console = Console(width=240, record=True)
    console.print(status_table(rows))
    return console.export_text()


def test_a_full_disk_is_shown() -> None:
    ok = NodeStatus("broker-a-n0", "broker-a", "127.0.0.1:1", 1, True, "LEADER", 2, "n0", 10)
    full = NodeStatus(
        "broker-a-n1",
        "broker-a",
        "127.0.0.1:2",
        2,
        True,
        "FOLLOWER",
        2,
        "n0",
        10,
        "disk full: journal at /d/raft/journal: No space left on device",
        True,
    )
    assert "disk" not in render([ok]).split("\n", 3)[2]
    text = render([ok, full])
    assert "FULL disk full: journal at /d/raft/journal: No space left on device" in text


def test_disk_pressure_is_shown() -> None:
    ok = NodeStatus("broker-a-n0", "broker-a", "127.0.0.1:1", 1, True, "LEADER", 2, "n0", 10)
    pressed = NodeStatus(
        "broker-a-n1",
        "broker-a",
        "127.0.0.1:2",
        2,
        True,
        "FOLLOWER",
        2,
        "n0",
        10,
        disk_pressure="this node stores 5 bytes, at its limit max_store_bytes=4",
    )
    text = render([ok, pressed])
    assert "PRESSURE this node stores 5 bytes, at its limit max_store_bytes=4" in text
