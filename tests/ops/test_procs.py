"""The pure parts of process supervision (start-time parsing, the state file, the PDEATHSIG race
check, port and message helpers) and the one supervision loop on small throwaway children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from raftmq.ops import cluster_state, ports, procs
from raftmq.ops.cluster_state import ClusterState, ProcessRecord

STAT = (
    "4242 (python3 -m a) b) S 1 4242 4242 0 -1 4194560 1234 0 0 0 10 5 0 0 20 0 3 0 "
    "987654 123456789 2000 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0"
)


def test_start_ticks_is_field_22_counted_after_the_command_name() -> None:
    assert procs.parse_start_ticks(STAT) == 987654
    assert procs.parse_state(STAT) == "S"
    own = procs.start_ticks(os.getpid())
    assert own is not None and own > 0
    assert procs.start_ticks(os.getpid()) == own  # stable for the life of the process
    assert procs.is_running(os.getpid(), own)
    assert not procs.is_running(os.getpid(), own + 1)  # a reused pid is not ours


def test_state_file_round_trip(tmp_path: Path) -> None:
    state = ClusterState(
        cluster="C",
        spec="deploy/cluster.toml",
        runner_pid=10,
        runner_start_ticks=11,
        detached=True,
        processes=(
            ProcessRecord("namesrv-0", "namesrv", 12, 13, (9876,), "data/namesrv-0/process.log"),
            ProcessRecord("broker-a-n0", "broker", 14, 15, (10911, 20911), "x.log"),
        ),
    )
    assert cluster_state.from_json(cluster_state.to_json(state)) == state
    path = cluster_state.state_path(tmp_path / "data")
    assert cluster_state.read(path) is None
    cluster_state.write(path, state)
    assert cluster_state.read(path) == state
    assert state.holder_of(20911) == state.processes[1] and state.holder_of(1) is None
    path.write_text("{not json")
    assert cluster_state.read(path) is None
    cluster_state.remove(path)
    cluster_state.remove(path)  # twice is fine
    assert not path.exists()


def test_pdeathsig_preexec_ends_a_child_whose_parent_already_died() -> None:
    calls: list[tuple[int, int]] = []
    ended: list[bool] = []

    def prctl(option: int, value: int) -> int:
        calls.append((option, value))
        return 0

    same = procs.die_with_parent(
        100, prctl=prctl, getppid=lambda: 100, kill_self=lambda: ended.append(True)
    )
    same()
    assert calls == [(procs.PR_SET_PDEATHSIG, signal.SIGTERM)] and ended == []
    # The parent died between fork and prctl: the child was reparented and must end itself.
    orphan = procs.die_with_parent(
        100, prctl=prctl, getppid=lambda: 1, kill_self=lambda: ended.append(True)
    )
    orphan()
    assert ended == [True]
    refused = procs.die_with_parent(
        100, prctl=lambda o, v: -1, getppid=lambda: 1, kill_self=lambda: ended.append(True)
    )
    refused()
    assert ended == [True]  # no prctl, no check: the child just outlives a killed parent


def test_stop_escalates_to_sigkill_and_recorded_process_never_signals_a_reused_pid() -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ok', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ok\n"
        ticks = procs.start_ticks(stubborn.pid)
        assert ticks is not None
        with procs.RecordedProcess(stubborn.pid, ticks + 1) as stranger:
            assert stranger.poll() == 0  # not the process that was recorded
            stranger.send_signal(signal.SIGKILL)
        assert stubborn.poll() is None
        killed = procs.stop([polite, stubborn], grace_s=1.0)
        assert killed == [stubborn]
        assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    finally:
        for p in (stubborn, polite):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_recorded_process_stops_a_process_it_did_not_start() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = procs.start_ticks(child.pid)
        assert ticks is not None
        with procs.RecordedProcess(child.pid, ticks) as rec:
            assert rec.poll() is None
            assert procs.stop([rec], grace_s=10.0) == []
            assert rec.poll() == 0
        assert child.wait(timeout=5) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_listen_inodes_and_the_holder_of_a_port() -> None:
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    row = "   {}: 0100007F:{} {} {} 00000000:00000000 00:00000000 00000000  1000  0 {} 1"
    text = "\n".join(
        [
            head + "  timeout inode",
            row.format(0, "2694", "00000000:0000", "0A", 5551),
            row.format(1, "2694", "0100007F:E47A", "01", 5552),  # a connection, not a listener
            row.format(2, "2695", "00000000:0000", "0A", 5553),
        ]
    )
    assert ports.listen_inodes(text, 0x2694) == {5551}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert ports.in_use("127.0.0.1", port)
        assert ports.listener_pids(port) == [os.getpid()]
        assert ports.busy_ports([("a", "127.0.0.1", port)]) == [
            ports.BusyPort("a", "127.0.0.1", port)
        ]
        # this process's own command line: pytest's, or an xdist worker's (python -c ...)
        assert "python" in ports.command_line(os.getpid(), max_chars=10_000)
    assert not ports.in_use("127.0.0.1", port)


def test_a_child_gets_the_twin_switch_and_the_admin_keys_but_no_setting() -> None:
    """Settings reach a child by its flags only; the switch to the pure-Python twins reaches the
    whole process tree (a twin run of the suite must run its brokers on the twins too)."""
    env = procs.child_env(
        {
            "PATH": "/bin",
            "RAFTMQ_BROKER_FLUSH_POLICY": "SYNC_FLUSH",
            "RAFTMQ_NO_EXTENSIONS": "1",
            "RAFTMQ_ADMIN_ACCESS_KEY": "admin",
        }
    )
    assert env["RAFTMQ_NO_EXTENSIONS"] == "1" and env["RAFTMQ_ADMIN_ACCESS_KEY"] == "admin"
    assert "RAFTMQ_BROKER_FLUSH_POLICY" not in env and env["PATH"] == "/bin"
