"""The native node's outbound stream to a peer outlives the peer: a NativeLog (its real loop,
uvloop when installed) keeps reconnecting to a peer whose process died and came back, so a
restarted node hears its group again. The peer here is a plain socket speaking the frames."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from raftmq.raftlog import raft_codec
from raftmq.raftlog.config import RaftLogConfig
from raftmq.raftlog.native_log import NativeLog
from tests.harness.local_cluster import free_ports


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the node closed the stream")
        out += chunk
    return out


def _read_frame(conn: socket.socket) -> bytes:
    (n,) = raft_codec.FRAME_HEADER.unpack(_read_exactly(conn, raft_codec.FRAME_HEADER.size))
    return _read_exactly(conn, n)


def _accept_hello_and_a_frame(server: socket.socket, node_id: str) -> socket.socket:
    conn, _ = server.accept()
    conn.settimeout(5.0)
    sender, _sealed, _nonce = raft_codec.decode_hello(_read_frame(conn))
    assert sender == node_id
    _read_frame(conn)  # a PreVote: the node has no leader and campaigns every timeout
    return conn


def test_a_peer_that_died_and_came_back_is_reconnected_to(tmp_path: Path) -> None:
    own, peer = free_ports(2)
    node_id, peer_id = f"127.0.0.1:{own}", f"127.0.0.1:{peer}"
    server = socket.create_server(("127.0.0.1", peer))
    server.settimeout(10.0)
    log = NativeLog(RaftLogConfig(node_id, (peer_id,), tmp_path, raft_impl="native"))
    try:
        first = _accept_hello_and_a_frame(server, node_id)
        # The peer's process dies: its kernel resets the stream. The node's next writes meet a
        # closed transport (uvloop raises RuntimeError there, which used to end the link task:
        # the peer, once back, never heard this node again).
        first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        first.close()
        t0 = time.monotonic()
        again = _accept_hello_and_a_frame(server, node_id)  # within server's 10 s timeout
        again.close()
        # Reconnects at most every reconnect_ms once the peer listens; campaigns every 200-400 ms.
        assert time.monotonic() - t0 < 5.0
    finally:
        log.close()
        server.close()
