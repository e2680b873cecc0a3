"""The native shell's outbound stream to one peer (raft_node.PeerLink) on real sockets and the
loop the broker runs (uvloop): a peer killed with our frames unread in its socket resets the
connection, and the link must reconnect to the restarted peer instead of dying silently."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import pytest

from raftmq.raftlog import raft_codec
from raftmq.raftlog.config import RaftLogConfig
from raftmq.raftlog.native_log import _new_loop
from raftmq.raftlog.raft_messages import AppendResponse
from raftmq.raftlog.raft_node import PeerLink
from tests.harness.local_cluster import free_ports


class _Peer:
    """The far end: a real listening socket that reads the hello and the frames, and can die
    the way a SIGKILLed process does (its unread bytes make the kernel answer with a reset)."""

    def __init__(self, port: int, *, reads: bool, held: bool = False) -> None:
        self.port = port
        self.reads = reads
        self.held = held  # reads, but only after release()
        self.got: list[raft_codec.Frame] = []
        self.connected = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readexactly(raft_codec.FRAME_HEADER.size)
        (n,) = raft_codec.FRAME_HEADER.unpack(head)
        sender = raft_codec.decode_hello(await reader.readexactly(n)).sender
        self.writers.append(writer)
        self.connected.set()
        if not self.reads:
            # What arrives now stays unread in the kernel, as in a process that stopped reading.
            cast(asyncio.Transport, writer.transport).pause_reading()
            return
        if self.held:
            cast(asyncio.Transport, writer.transport).pause_reading()
        while True:
            head = await reader.readexactly(raft_codec.FRAME_HEADER.size)
            (n,) = raft_codec.FRAME_HEADER.unpack(head)
            self.got.append(raft_codec.decode(await reader.readexactly(n), sender, "me"))

    def release(self) -> None:
        for w in self.writers:
            cast(asyncio.Transport, w.transport).resume_reading()

    def kill(self) -> None:
        """Close every socket at once, unread bytes and all (SIGKILL: the kernel resets)."""
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()  # the socket closes with unread bytes: the kernel resets


def test_a_link_reconnects_after_its_peer_died_with_frames_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGKILLed follower with unread acks in its socket resets the connection; uvloop then
    closes the transport while the link waits for frames, and the next write raised
    RuntimeError, which ended the link's task for good: the new leader never reached the
    restarted node (test_sigkill_leader_keeps_acknowledged_messages, one run in six)."""
    me, far = free_ports(2)
    cfg = RaftLogConfig(f"127.0.0.1:{me}", (f"127.0.0.1:{far}",), tmp_path, reconnect_ms=100)

    def message(k: int) -> AppendResponse:
        return AppendResponse(cfg.node_id, cfg.peers[0], 1, True, k, 0, True)

    async def scenario() -> None:
        dying = _Peer(far, reads=False)
        await dying.start()
        link = PeerLink(cfg.node_id, cfg.peers[0], None, cfg, lambda *_: None)
        await asyncio.wait_for(dying.connected.wait(), 5)
        for k in range(3):  # left unread in the dying peer's socket
            link.send(message(k))
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        dying.kill()
        # Idle while the reset arrives and the loop closes the transport (the link sends
        # nothing meanwhile, as a follower between acks); then the peer is back on its port.
        await asyncio.sleep(0.2)
        back = _Peer(far, reads=True)
        await back.start()
        deadline = time.monotonic() + 10
        k = 100
        while not back.got and time.monotonic() < deadline:
            assert not link.task.done(), f"the link's task ended: {link.task.exception()!r}"
            link.send(message(k))  # a heartbeat's worth of traffic
            k += 1
            await asyncio.sleep(0.01)
        assert back.got, "the link never reached the restarted peer"
        assert isinstance(back.got[0], AppendResponse)
        link.close()
        assert back.server is not None
        back.server.close()

    loop = _new_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
    # Reconnected as a lost connection, not rescued by the link's last-resort catch.
    assert "raft.peer_link_failed" not in caplog.text


def test_frames_a_full_connection_cannot_take_yet_follow_in_order_after_the_drain(
    tmp_path: Path,
) -> None:
    """A Ready's frames are written on its own loop turn only while the connection's buffer is
    empty; behind a peer that reads slowly they wait in the link for the stream task's drain,
    and none is lost or overtaken (a frame written past the queued ones would reorder Raft's
    appends; one left queued would wait for the next message to leave)."""
    me, far = free_ports(2)
    cfg = RaftLogConfig(f"127.0.0.1:{me}", (f"127.0.0.1:{far}",), tmp_path, reconnect_ms=100)
    count, size = 48, 256 * 1024  # 12 MiB: more than loopback's socket buffers hold

    async def scenario() -> None:
        peer = _Peer(far, reads=True, held=True)
        await peer.start()
        link = PeerLink(cfg.node_id, cfg.peers[0], None, cfg, lambda *_: None)
        await asyncio.wait_for(peer.connected.wait(), 5)
        await asyncio.sleep(0.05)
        queued = 0
        for k in range(count):
            link.send(raft_codec.RecordCopy(k + 1, 1, bytes([k]) * size))
            queued = max(queued, len(link.out.frames))
        assert queued > 0, "every frame was written at once: the drain path was not reached"
        peer.release()
        deadline = time.monotonic() + 20
        while len(peer.got) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        got = [m.index for m in peer.got if isinstance(m, raft_codec.RecordCopy)]
        assert got == list(range(1, count + 1))
        assert not link.out.frames and link.out.nbytes == 0
        link.close()
        assert peer.server is not None
        peer.server.close()

    loop = _new_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
