"""The native Raft port is mutual TLS when TLS is on, checked on the wire: a relay in front of each
node of a real three-process group records every byte the nodes send each other; each connection
opens with a TLS handshake and no payload crosses in clear (the same relay without TLS does see
it). A peer that speaks the other protocol, or holds a certificate of another CA, is refused and
the node says so in its log."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.ops.certs import CertRequest, write_certs
from raftmq.raftlog import raft_codec
from tests.harness.local_cluster import LocalCluster
from tests.harness.wire_tap import WireTap
from tests.raftlog.test_cluster import check_logs, submit_all

MARKER = b"raftmq-clear-text-marker:"
PASSWORD = "s3cret"
TLS_HANDSHAKE = 0x16  # a TLS record of content type handshake
TLS_MAJOR = 0x03


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    write_certs(d, [CertRequest("node", ("127.0.0.1",))], days=2)
    return d


def _tls_args(certs: Path) -> tuple[str, ...]:
    return ("--tls-ca", str(certs / "ca.crt"), "--tls-cert", str(certs / "node.crt"),
            "--tls-key", str(certs / "node.key"))  # fmt: skip


@contextlib.contextmanager
def tapped_group(root: Path, *args: str) -> Iterator[tuple[LocalCluster, list[WireTap]]]:
    """Three native nodes, each behind a relay on its Raft address: every byte between two
    nodes crosses a tap."""
    c = LocalCluster(root, relayed=True, extra_args=("--raft-impl", "native", *args))
    taps = [WireTap(n.raft_addr, n.listen) for n in c.nodes]
    try:
        c.start_all()
        yield c, taps
    finally:
        c.close()
        for t in taps:
            t.close()


def _replicate_markers(c: LocalCluster) -> int:
    leader = c.leader(timeout_s=15)
    payloads = [MARKER + str(i).encode() * 20 for i in range(100)]
    acked, failed = submit_all(c, leader, payloads)
    assert failed == 0
    check_logs(c, [0, 1, 2], acked)  # replicated, so it crossed the taps twice
    return sum(len(p) for p in payloads)


def _streams(taps: list[WireTap], timeout_s: float = 10.0) -> list[tuple[bytes, bytes]]:
    """Every relayed connection that carried bytes, once each node's two outbound streams have
    (a node connects to each peer on its own schedule: a tap sees a stream once it opens)."""
    deadline = time.monotonic() + timeout_s
    while True:
        per_tap = [[s for s in t.snapshot() if s[0]] for t in taps]
        if all(len(streams) >= 2 for streams in per_tap) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    counts = [len(streams) for streams in per_tap]
    assert min(counts) >= 2, f"streams seen per node: {counts}"
    return [s for streams in per_tap for s in streams]


def _wait_log(c: LocalCluster, i: int, *needles: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in c.nodes[i].log_path.read_text(errors="replace").splitlines():
            if all(n in line for n in needles):
                return line
        time.sleep(0.05)
    raise AssertionError(f"node {i} logged no line with {needles}:\n{c.tail(i)}")


def _connect(address: str) -> socket.socket:
    """A plain connection straight to a node's port (not through its tap)."""
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(10)
    try:
        return s.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


def test_raft_between_native_nodes_is_tls_on_the_wire(tmp_path: Path, certs: Path) -> None:
    # With the Raft password, as a broker has it under TLS (raft.key): TLS carries the frames,
    # the password is proved in each connection's hello.
    with tapped_group(tmp_path, *_tls_args(certs), "--password", PASSWORD) as (c, taps):
        sent = _replicate_markers(c)
        streams = _streams(taps)
        assert sum(len(up) for up, _ in streams) > sent  # the entries did cross the taps
        for up, down in streams:
            assert up[:2] == bytes([TLS_HANDSHAKE, TLS_MAJOR]), up[:16]  # a ClientHello
            # Its answer (none yet on a stream caught opening, or one a busy peer dropped).
            assert down[:2] in (b"", bytes([TLS_HANDSHAKE, TLS_MAJOR])), down[:16]
        in_clear = [i for i, (up, down) in enumerate(streams) if MARKER in up or MARKER in down]
        assert in_clear == []

        # A plaintext peer naming a member in its hello is refused, and the node says why.
        peer = c.nodes[1].raft_addr
        with _connect(c.nodes[0].listen) as s:
            hello = raft_codec.encode_hello(peer, raft_codec.PLAIN, bytes(16))
            s.sendall(raft_codec.FRAME_HEADER.pack(len(hello)) + hello)
            assert _closed_by_peer(s)
        line = _wait_log(c, 0, "raft.peer_refused", "plaintext_peer_on_tls_port")
        assert "--tls-*" in line

        # A certificate of another CA does not get in either.
        stranger = tmp_path / "stranger"
        write_certs(stranger, [CertRequest("node", ("127.0.0.1",))], days=2)
        ctx = ssl.create_default_context(cafile=certs / "ca.crt")
        ctx.load_cert_chain(stranger / "node.crt", stranger / "node.key")
        with (
            _connect(c.nodes[0].listen) as s,
            contextlib.suppress(ssl.SSLError, ConnectionError),
            ctx.wrap_socket(s, server_hostname="127.0.0.1") as tls_sock,
        ):
            tls_sock.sendall(hello)
            assert _closed_by_peer(tls_sock)
        _wait_log(c, 0, "raft.peer_refused", "tls_handshake_failed")

        # A certificate of this CA (an SDK's, say) without the Raft password does not either.
        ctx = ssl.create_default_context(cafile=certs / "ca.crt")
        ctx.load_cert_chain(certs / "node.crt", certs / "node.key")
        nonce = bytes(16)
        wrong = raft_codec.hello_proof(raft_codec.derive_key("guess"), nonce, peer)
        hello = raft_codec.encode_hello(peer, raft_codec.PROVED, nonce, wrong)
        with (
            _connect(c.nodes[0].listen) as s,
            ctx.wrap_socket(s, server_hostname="127.0.0.1") as tls_sock,
        ):
            tls_sock.sendall(raft_codec.FRAME_HEADER.pack(len(hello)) + hello)
            assert _closed_by_peer(tls_sock)
        _wait_log(c, 0, "raft.bad_peer_stream", "does not prove the Raft password")


def test_without_tls_the_same_tap_reads_the_entries(tmp_path: Path, certs: Path) -> None:
    """The control: the relay does see payloads in clear when the nodes send them so (the
    test above would pass vacuously otherwise), and a TLS peer on a plaintext port is named."""
    with tapped_group(tmp_path) as (c, taps):
        _replicate_markers(c)
        streams = _streams(taps)
        assert [i for i, (up, _) in enumerate(streams) if MARKER in up] != []
        assert [up[:1] for up, _ in streams if up[:1] == bytes([TLS_HANDSHAKE])] == []

        ctx = ssl.create_default_context(cafile=certs / "ca.crt")
        ctx.load_cert_chain(certs / "node.crt", certs / "node.key")
        with _connect(c.nodes[0].listen) as s, pytest.raises((ssl.SSLError, ConnectionError)):
            ctx.wrap_socket(s, server_hostname="127.0.0.1")
        _wait_log(c, 0, "raft.peer_refused", "tls_peer_on_plaintext_port")

        # Inbound streams are bounded (4 per peer + 8): silent connections past it are closed
        # at once and said, instead of each holding a task until the hello's timeout.
        silent = [_connect(c.nodes[0].listen) for _ in range(4 * 2 + 8 + 4)]
        try:
            _wait_log(c, 0, "raft.peer_refused", "too_many_connections")
        finally:
            for s in silent:
                s.close()
