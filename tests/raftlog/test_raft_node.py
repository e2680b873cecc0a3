"""The native node shell (raft_node.py) against real sockets and files: its outbound stream to a
peer outlives the peer (a NativeLog on its real loop, uvloop when installed, keeps reconnecting to a
peer whose process died; the peer is a plain socket speaking the frames), and a commit-index hint
never holds back a Ready's acks."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path

from raftmq.raftlog import raft_codec
from raftmq.raftlog.config import RaftLogConfig
from raftmq.raftlog.errors import EntryTooLargeError, OutcomeUnknownError
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore
from raftmq.raftlog.native_log import NativeLog
from raftmq.raftlog.raft_messages import HardState, Ready
from raftmq.raftlog.raft_node import RaftNodeShell
from raftmq.raftlog.raft_storage import JournalStorage
from raftmq.raftlog.record import CommitResult, Committed
from raftmq.raftlog.storage_health import StorageHealth
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
    sender = raft_codec.decode_hello(_read_frame(conn)).sender
    assert sender == node_id
    _read_frame(conn)  # a PreVote: the node has no leader and campaigns every timeout
    return conn


def test_a_peer_that_died_and_came_back_is_reconnected_to(tmp_path: Path) -> None:
    own, peer = free_ports(2)
    node_id, peer_id = f"127.0.0.1:{own}", f"127.0.0.1:{peer}"
    server = socket.create_server(("127.0.0.1", peer))
    server.settimeout(10.0)
    log = NativeLog(RaftLogConfig(node_id, (peer_id,), tmp_path))
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


def _ready(hs: HardState) -> Ready:
    return Ready(hard_state=hs, snapshot=None, entries=(), messages=(), committed=())


def test_a_commit_hint_never_holds_back_a_readys_acks(tmp_path: Path) -> None:
    """The commit index is only a restart hint: a Ready whose hard state changed only there is
    finished at once (its acks leave) and the hint is written behind it; a new term or vote is
    written before the Ready finishes, in order after the hints."""
    own, peer = free_ports(2)
    cfg = RaftLogConfig(f"127.0.0.1:{own}", (f"127.0.0.1:{peer}",), tmp_path)
    meta = MetaStore(tmp_path / "raft.meta")
    journal = SegmentJournal(tmp_path / "journal")
    shell = RaftNodeShell(
        cfg,
        JournalStorage(journal, meta),
        StorageHealth(cfg.node_id),
        lambda _: None,
        lambda _: None,
    )

    async def persist() -> None:
        # Acks waited once a second for this fsync: the group stalled while followers' hung.
        assert shell._persist(_ready(HardState(0, None, 7))) is None
        vote = shell._persist(_ready(HardState(3, cfg.node_id, 7)))
        assert vote is not None
        await vote
        shell._meta_writer.shutdown(wait=True)

    try:
        asyncio.run(persist())
        stored = meta.load()
        assert (stored.current_term, stored.voted_for, stored.commit_index) == (3, cfg.node_id, 7)
    finally:
        journal.close()


def test_async_flush_syncs_on_its_own_thread_and_the_log_says_its_leadership(
    tmp_path: Path,
) -> None:
    """ASYNC_FLUSH's fdatasync runs on the node's flusher thread (not the loop's executor): what
    a group of one commits is synced within a few flush intervals, and the thread ends with the
    node. leadership() says what status() says."""
    (own,) = free_ports(1)
    log = NativeLog(RaftLogConfig(f"127.0.0.1:{own}", (), tmp_path, flush_interval_ms=5))
    try:
        deadline = time.monotonic() + 10
        while not log.is_leader() and time.monotonic() < deadline:
            time.sleep(0.01)
        st = log.status()
        assert log.leadership() == (st.role, st.term, st.leader) and log.is_leader()
        journal = log._journal
        for k in range(20):
            log.submit(b"entry %d" % k).result(10)
            deadline = time.monotonic() + 5
            while journal.dirty and time.monotonic() < deadline:
                time.sleep(0.002)
            assert not journal.dirty, f"entry {k} was not synced"
        flusher = log._node._flusher
        assert flusher is not None and flusher._thread.name == "raft-flush"
        assert flusher._thread.is_alive()
    finally:
        log.close()
    assert not flusher._thread.is_alive()


class _Recorder:
    """A CommitWaiter that keeps each call's batch (the log's loop thread calls it)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[object, CommitResult]]] = []
        self.cond = threading.Condition()

    def committed(self, done: list[tuple[object, CommitResult]]) -> None:
        with self.cond:
            self.calls.append(list(done))
            self.cond.notify_all()

    def wait_for(self, n: int, timeout_s: float) -> dict[object, CommitResult]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while sum(len(c) for c in self.calls) < n and time.monotonic() < deadline:
                self.cond.wait(0.05)
            results = [r for c in self.calls for r in c]
        tokens = [t for t, _ in results]
        assert len(tokens) == len(set(tokens)), "a chunk was reported twice"
        return dict(results)


def _wait_leader(logs: list[NativeLog], timeout_s: float = 10) -> NativeLog:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in logs:
            if log.is_leader_ready():
                return log
        time.sleep(0.01)
    raise AssertionError("no leader")


def test_one_commit_advance_reports_each_chunk_its_own_place_in_one_call(
    tmp_path: Path,
) -> None:
    """submit_to: the chunks one proposal packs into several entries are reported to their
    waiter in one call per commit advance (not a future per chunk), each with its token and
    the (index, slot) where read() finds it; a refused chunk is answered at once."""
    (own,) = free_ports(1)
    cfg = RaftLogConfig(f"127.0.0.1:{own}", (), tmp_path, max_chunks_per_entry=4)
    log = NativeLog(cfg)
    try:
        _wait_leader([log])
        waiter = _Recorder()
        payloads = [b"chunk %d" % k for k in range(10)]
        too_big = b"x" * (cfg.max_entry_bytes + 1)
        refused = log.submit_to(waiter, [*payloads, too_big], [*range(10), "big"])
        assert refused[:10] == [None] * 10 and isinstance(refused[10], EntryTooLargeError)
        results = waiter.wait_for(10, 10)
        assert sorted(results, key=str) == sorted(range(10), key=str)
        assert len(waiter.calls) == 1, [len(c) for c in waiter.calls]
        indexes = set()
        for k, payload in enumerate(payloads):
            c = results[k]
            assert isinstance(c, Committed)
            assert log.read(c.index).chunks[c.slot] == payload
            indexes.add(c.index)
        assert len(indexes) == 3  # ten chunks, at most four per entry
    finally:
        log.close()


def test_a_lost_leadership_answers_every_waiting_chunk_its_error_once(tmp_path: Path) -> None:
    """A leader cut off from its followers holds its proposals uncommitted; when it steps down
    (check-quorum) every waiting chunk of every request is answered OutcomeUnknownError, once,
    in one call to its waiter, and none is answered before."""
    ports = free_ports(3)
    ids = [f"127.0.0.1:{p}" for p in ports]
    logs = [
        NativeLog(RaftLogConfig(me, tuple(i for i in ids if i != me), tmp_path / str(k)))
        for k, me in enumerate(ids)
    ]
    try:
        leader = _wait_leader(logs)
        leader.block_peers(frozenset(i for i in ids if i != leader.cfg.node_id))
        waiter = _Recorder()
        first = leader.submit_to(waiter, [b"a", b"b", b"c"], [("r1", 0), ("r1", 1), ("r1", 2)])
        second = leader.submit_to(waiter, [b"d"], [("r2", 0)])
        assert first + second == [None] * 4
        time.sleep(0.05)
        assert waiter.calls == []  # not committed: nobody answered yet
        results = waiter.wait_for(4, 10)
        assert set(results) == {("r1", 0), ("r1", 1), ("r1", 2), ("r2", 0)}
        assert all(isinstance(r, OutcomeUnknownError) for r in results.values()), results
        assert len(waiter.calls) == 1
        assert not leader.is_leader()
    finally:
        for log in logs:
            log.close(transfer_leadership=False)
