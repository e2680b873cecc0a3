"""A controller that cannot bind its metrics port exits with the reason, not a traceback from
closing a node it never started (seen when another process took a free port first: the
secure recipe's controller-1 ended with "cannot join thread before it is started")."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.harness.local_cluster import free_ports


def test_a_busy_metrics_port_is_a_clean_exit(tmp_path: Path) -> None:
    grpc_port, raft_port, metrics_port = free_ports(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", metrics_port))
        held.listen()
        done = subprocess.run(
            [sys.executable, "-m", "raftmq.controller.server", "--node-id", "c0",
             "--listen", f"127.0.0.1:{grpc_port}", "--raft-address", f"127.0.0.1:{raft_port}",
             "--metrics-listen", f"127.0.0.1:{metrics_port}", "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "controller.listen_failed" in out and "address already in use" in out, out
    assert "Traceback" not in out, out
