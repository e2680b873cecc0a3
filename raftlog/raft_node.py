"""The native Raft core's node shell on one asyncio loop: ticks are loop timers, peers are framed
TCP streams (raft_codec), and each Ready is handled exactly as its contract says.

Everything runs on the loop's thread but an fdatasync (one executor call per Ready, SYNC_FLUSH)
and the meta file's atomic write. It decides nothing Raft (raft_core does) and never blocks the
loop on a peer: per-peer queues are bounded in bytes and a full one drops (Raft resends).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import queue
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from raftmq.raftlog import raft_codec
from raftmq.raftlog.config import FlushPolicy, RaftLogConfig
from raftmq.raftlog.errors import CorruptJournalError, RaftLogError
from raftmq.raftlog.frame_reader import FrameReader, FrameTooLargeError
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.raft_core import RaftConfig, RaftCore, Role
from raftmq.raftlog.raft_messages import (
    AppendEntries,
    AppendResponse,
    Entry,
    HardState,
    Message,
    Ready,
)
from raftmq.raftlog.raft_storage import JournalStorage
from raftmq.raftlog.record import Role as LogRole
from raftmq.raftlog.record import RoleChange, TimelineStamp
from raftmq.raftlog.snapshot import Snapshot
from raftmq.raftlog.storage_health import StorageHealth

log = logging.getLogger("raftlog.raft_node")

ROLE_OF = {
    Role.FOLLOWER: LogRole.FOLLOWER,
    Role.PRE_CANDIDATE: LogRole.FOLLOWER,
    Role.CANDIDATE: LogRole.CANDIDATE,
    Role.LEADER: LogRole.LEADER,
}
TICK_MS = 10  # one core tick; election and heartbeat settings are whole numbers of it
_HELLO_TIMEOUT_S = 5.0
_MAX_HELLO_BYTES = 4096  # a peer not yet accepted may announce no larger frame
_FIRST_RETRY_S = 0.02  # the first reconnect attempt's wait
REPAIR_RETRY_S = 1.0  # a corrupt record's copy is asked of every peer this often until repaired
_MAX_REPAIRS_ASKED = 16  # records asked for per round (the rest wait for the next rounds)
_MAX_UNREADABLE_LOGGED = 1024  # (peer, index) pairs remembered so each is logged once
# Inbound streams at once: each member holds one to us; the rest is room for reconnects
# overlapping a closing stream, and a bound against a stranger opening thousands.
_MAX_INBOUND_PER_PEER = 4
_MAX_INBOUND_EXTRA = 8
_REFUSAL_LOG_EVERY_S = 30.0  # one line per kind of refusal and peer address this often
_MAX_REFUSALS_REMEMBERED = 256


_MODE_TEXT = {
    raft_codec.PLAIN: "has no Raft password",
    raft_codec.SEALED: "seals its frames with the Raft password (no TLS)",
    raft_codec.PROVED: "has TLS and a Raft password",
}


def core_config(cfg: RaftLogConfig) -> RaftConfig:
    """The core's timing from the node's settings (ms to ticks of TICK_MS)."""
    return RaftConfig(
        election_ticks=max(2, cfg.election_timeout_min_ms // TICK_MS),
        heartbeat_ticks=max(1, cfg.heartbeat_ms // TICK_MS),
        tick_ms=TICK_MS,
        max_inflight=8,
        # Entries are up to batch_max_bytes (1 MiB): 8 appends of 2 stay within the per-peer
        # queue bound (max_inflight_bytes_per_peer, 16 MiB), so appends are not dropped there.
        max_entries_per_append=2,
        max_committed_per_ready=64,  # entries are up to batch_max_bytes each: bound the reads
        check_quorum=max(0, cfg.leader_fallback_ms // TICK_MS),
    )


@dataclass(slots=True)
class _Outbox:
    """Frames waiting for one peer's connection, each with its body's length; bounded in
    bytes."""

    frames: deque[tuple[list[bytes], int]]
    nbytes: int = 0
    dropped: int = 0


# What a node tells its peers about itself (RaftLogConfig.hello_features) rides in its hello's
# nonce, the one field every node since the first takes as opaque bytes (a new field would make
# a node of before refuse the hello): 8 random bytes, this mark, the byte. The nonce still
# differs per connection (64 random bits: what the sealer and the proof need), and a node of
# before, whose nonce is 16 random bytes, carries the mark by chance once in 2**56 connections.
_FEATURES_MARK = b"rmqfeat"


def hello_nonce(features: int) -> bytes:
    """A fresh hello nonce carrying `features` (0..255; 0: a plain random nonce)."""
    if not features:
        return os.urandom(raft_codec.NONCE_BYTES)
    random_part = raft_codec.NONCE_BYTES - len(_FEATURES_MARK) - 1
    return os.urandom(random_part) + _FEATURES_MARK + bytes((features,))


def features_of(nonce: bytes) -> int:
    """The byte a peer's hello nonce carries; 0 when it says nothing (a node of before)."""
    at = raft_codec.NONCE_BYTES - len(_FEATURES_MARK) - 1
    if len(nonce) == raft_codec.NONCE_BYTES and nonce[at:-1] == _FEATURES_MARK:
        return nonce[-1]
    return 0


class PeerLink:
    """This node's outbound stream to one peer: connects (and reconnects), says hello, writes
    queued frames in order. Messages queued while it is down are dropped: Raft resends."""

    def __init__(
        self,
        node_id: str,
        peer: str,
        key: bytes | None,
        cfg: RaftLogConfig,
        refused: Callable[[str, str, str], None],
    ) -> None:
        self.node_id = node_id
        self.peer = peer
        self.key = key
        self.cfg = cfg
        # Under TLS the password admits a peer (a proof in its hello) and TLS protects the
        # frames; without TLS it seals every frame (design.md, "Raft over TLS").
        self.mode = raft_codec.hello_mode(key, cfg.tls is not None)
        self._refused = refused  # the node's rate-limited warning for what an operator must fix
        self.out = _Outbox(deque())
        self._wake = asyncio.Event()
        self._connected = False
        self._writer: asyncio.StreamWriter | None = None  # set while connected, hello sent
        self._sealer: raft_codec.Sealer | None = None  # this connection's, in SEALED mode
        self._closed = False
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"raft-peer-{peer}")

    def close(self) -> None:
        """Stop for good. The flag, not only the cancel: a cancel that lands as a connect
        attempt fails can be lost (Python 3.11's wait_for), and the link would retry forever."""
        self._closed = True
        self.task.cancel()

    def send(self, m: raft_codec.Frame) -> None:
        """One message, written now (see flush)."""
        self.queue(m)
        self.flush()

    def queue(self, m: raft_codec.Frame) -> None:
        """One message for the next flush(): a Ready's messages to this peer leave together."""
        if not self._connected:
            return
        body = raft_codec.encode(m)
        n = sum(map(len, body))
        if self.out.nbytes + n > self.cfg.max_inflight_bytes_per_peer:
            self.out.dropped += 1  # a slow follower: the core's flow control resends later
            return
        self.out.frames.append((body, n))
        self.out.nbytes += n

    def flush(self) -> None:
        """Write the queued frames now, on the caller's loop turn, when the connection is up
        and takes them without waiting (its write buffer is empty): a hop costs no wake-up of
        the stream task (an Event, a task step and a drain per message, ~10 % of a follower's
        loop per entry). Otherwise the stream task writes them after its drain, or sees the
        reset (a transport uvloop closed raises RuntimeError on a write, so never here)."""
        if not self.out.frames:
            return
        w = self._writer
        if w is None or w.is_closing() or w.transport.get_write_buffer_size():
            self._wake.set()
            return
        self._write_queued(w)
        if w.transport.get_write_buffer_size():
            self._wake.set()  # the kernel took part of it: the stream task drains

    def _write_queued(self, writer: asyncio.StreamWriter) -> None:
        """Every queued frame in one writelines (one syscall), in order."""
        header, sealer, out = raft_codec.FRAME_HEADER, self._sealer, self.out
        chunks: list[bytes] = []
        while out.frames:
            body, n = out.frames.popleft()
            out.nbytes -= n
            if sealer is not None:
                sealed = sealer.seal(b"".join(body))
                chunks += (header.pack(len(sealed)), sealed)
            else:
                chunks.append(header.pack(n))
                chunks += body
        writer.writelines(chunks)

    async def _run(self) -> None:
        host, _, port = self.peer.rpartition(":")
        max_retry_s = self.cfg.reconnect_ms / 1000
        retry_s = _FIRST_RETRY_S
        while not self._closed:
            tls = self.cfg.tls
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can drop a cancel that lands as
                # a connect attempt fails, and close() then waited for the link (raftcore).
                async with asyncio.timeout(max_retry_s * 4):
                    reader, writer = await asyncio.open_connection(
                        host,
                        int(port),
                        ssl=tls.client if tls is not None else None,
                        server_hostname=host if tls is not None else None,
                    )
            except ssl.SSLEOFError:
                # Closed during the handshake: a peer going down, or a plaintext one (which
                # logs the refusal on its side). Retried as any failed connect.
                await asyncio.sleep(retry_s)
                retry_s = min(max_retry_s, retry_s * 2)
                continue
            except ssl.SSLError as exc:
                # A peer without TLS, or a certificate ours does not trust: said, then retried
                # as any failed connect (the peer may be restarting with the right flags).
                self._refused(
                    self.peer,
                    f"tls_handshake_failed error={_ssl_reason(exc)}",
                    "give every node of the group the same --tls-* flags and a certificate of "
                    "the same CA that names its host",
                )
                await asyncio.sleep(retry_s)
                retry_s = min(max_retry_s, retry_s * 2)
                continue
            except (OSError, TimeoutError):
                # Doubling up to reconnect_ms: a restarting peer is heard again within ~50 ms
                # of listening, a dead one costs a connect attempt per reconnect_ms.
                await asyncio.sleep(retry_s)
                retry_s = min(max_retry_s, retry_s * 2)
                continue
            retry_s = _FIRST_RETRY_S
            # The peer never writes on this stream, so a read that ends means it left (a FIN,
            # e.g. a restart): noticed now rather than at a later write that may never fail.
            stream = asyncio.ensure_future(self._stream(writer))
            gone = asyncio.ensure_future(reader.read(1))
            try:
                await asyncio.wait((stream, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stream.cancel()
                gone.cancel()
                await asyncio.gather(stream, gone, return_exceptions=True)
                self._connected = False
                self._writer = None
                self._sealer = None
                self.out.frames.clear()
                self.out.nbytes = 0
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            failure = None if stream.cancelled() else stream.exception()
            if failure is not None and not isinstance(
                failure, (OSError, ConnectionError, asyncio.IncompleteReadError)
            ):
                # A bug, never a reason to stop: a link that ended would cut this node off from
                # its peer for good (Raft cannot tell it from a network that drops everything).
                log.error(
                    "raft.peer_link_failed node=%s peer=%s",
                    self.node_id,
                    self.peer,
                    exc_info=failure,
                )
                retry_s = max_retry_s  # not a tight loop of tracebacks
            await asyncio.sleep(retry_s)

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        nonce = hello_nonce(self.cfg.hello_features)
        key, mode = self.key, self.mode
        proof = b""
        sealer = None
        if key is not None and mode == raft_codec.PROVED:
            proof = raft_codec.hello_proof(key, nonce, self.node_id)
        elif key is not None and mode == raft_codec.SEALED:
            sealer = raft_codec.Sealer(key, nonce)
        hello = raft_codec.encode_hello(self.node_id, mode, nonce, proof)
        writer.write(raft_codec.FRAME_HEADER.pack(len(hello)) + hello)
        self._sealer = sealer
        self._writer = writer
        self._connected = True
        while True:
            # Woken by flush() when it could not write: the buffer was not empty (drained
            # here first), or the transport is closing (raised here).
            self._wake.clear()
            if writer.is_closing():
                # The peer reset the connection while we waited (a SIGKILLed peer with our
                # frames unread): uvloop has closed the transport, and a write now raises
                # RuntimeError instead of the connection error it is.
                raise ConnectionResetError(f"connection to {self.peer} was closed")
            await writer.drain()
            if self.out.frames:
                if writer.is_closing():
                    raise ConnectionResetError(f"connection to {self.peer} was closed")
                self._write_queued(writer)  # one write and one drain per batch of frames
                continue
            await self._wake.wait()


class _Flusher:
    """ASYNC_FLUSH's fdatasync, on a thread of its own: the loop asks for one group sync at a
    time (request), and the thread reports to the storage health itself (thread-safe), so the
    loop is not woken when it ends. Through the loop's default executor each sync cost the loop
    a future, a chained loop future, a wake-up and two callbacks (~10 % of a follower's loop
    per W2 entry); here, one SimpleQueue put."""

    def __init__(self, journal: SegmentJournal, health: StorageHealth, name: str) -> None:
        self._journal = journal
        self._health = health
        self._asks: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: sync; False: stop
        self.busy = False  # a sync is asked for or under way: the loop asks for no other
        self.not_before = 0.0  # after a failed sync, the health's back-off (monotonic s)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Loop: one sync of what the journal holds now (only while not busy: bounded)."""
        self.busy = True
        self._asks.put(True)

    def close(self) -> None:
        """Stop after the sync under way, if any (bounded: a hung disk does not hold the node's
        stop past its own timeout; the journal's close waits for that sync anyway)."""
        self._asks.put(False)
        self._thread.join(5)

    def _run(self) -> None:
        journal, health, where = self._journal, self._health, "journal sync"
        while self._asks.get():
            try:
                journal.sync()
            except OSError as exc:
                now = time.monotonic()
                self.not_before = now + health.failed(where, str(journal.directory), exc, now)
            except Exception:  # a bug: loud, and the next tick asks again
                log.exception("raft.journal_sync_bug")
            else:
                health.succeeded(where, time.monotonic())
            self.busy = False  # last: the loop asks again only after the outcome is recorded


class RaftNodeShell:
    """One node: build it on the loop that will run it (await start()), then feed it proposals
    with propose(); committed entries and role changes come out through the callbacks."""

    def __init__(
        self,
        cfg: RaftLogConfig,
        storage: JournalStorage,
        health: StorageHealth,
        on_committed: Callable[[tuple[Entry, ...]], None],
        on_role: Callable[[RoleChange], None],
        on_tick: Callable[[], None] | None = None,
        applied_hint: int = 0,
        stamp: TimelineStamp | None = None,
    ) -> None:
        self.cfg = cfg
        self._stamp = stamp  # the process's timeline (bench/w2_timeline.py); None: off
        self.id = cfg.node_id
        self.storage = storage
        self.health = health
        self.key = raft_codec.derive_key(cfg.password) if cfg.password else None
        # Under TLS the password admits a peer (a proof in its hello) and TLS protects the
        # frames; without TLS it seals every frame (design.md, "Raft over TLS").
        self.mode = raft_codec.hello_mode(self.key, cfg.tls is not None)
        # peer -> the byte its latest hello said (features_of); replaced whole on each change,
        # so another thread reads a consistent mapping without a lock.
        self.peer_features: Mapping[str, int] = {}
        self._on_committed = on_committed
        self._on_role = on_role
        self._on_tick = on_tick
        hs = storage.load_hard_state()
        base_index, base_term = storage.base()
        last = storage.last_index
        # What the state machine applied was committed: a restart knows it committed even where
        # the commit hint (stored at most once a second) lags, and reads it at once.
        commit = min(max(hs.commit, applied_hint), last)
        self.core = RaftCore(
            self.id,
            cfg.members,
            core_config(cfg),
            seed=int.from_bytes(os.urandom(8), "little"),
            hard_state=type(hs)(hs.term, hs.vote, commit),
            storage=storage,
            base=(base_index, base_term),
            # Entries up to the commit hint are committed: not handed to apply again.
            applied_index=max(commit, base_index),
            apply_payloads=False,  # NativeLog's readers read the journal; it resolves by position
        )
        self.applied = self.core.applied
        self.core.on_unreadable = self._unreadable_for_peer
        self._unreadable_logged: set[tuple[str, int | None]] = set()
        self.blocked: frozenset[str] = frozenset()
        self._links: dict[str, PeerLink] = {}
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._refusals: dict[tuple[str, str], float] = {}  # (address, kind) -> last logged
        self._finishing: asyncio.Task[None] | None = None  # a Ready waiting on its persist
        self._busy = False  # a Ready is being handled (maybe waiting on fdatasync)
        self._persist_failing = False  # that Ready's persist failed: retried after a back-off
        self._scheduled = False
        self._ready_handle: asyncio.Handle | None = None  # the kick's call of _start_ready
        self._tick_handle: asyncio.TimerHandle | None = None
        self._role_key: tuple[Role, int, str | None] | None = None
        self._sync = cfg.flush_policy is FlushPolicy.SYNC_FLUSH
        self._next_flush = 0.0
        self._next_commit_save = 0.0
        self._flusher: _Flusher | None = None  # ASYNC_FLUSH's sync thread, from start()
        self._next_repair = 0.0
        self._closed = False
        self._inbound: set[asyncio.Task[None]] = set()
        # Every write of the meta file (term, vote, commit hint), in the order handed over.
        self._meta_writer = ThreadPoolExecutor(1, thread_name_prefix="raft-meta")
        # Installs a leader's snapshot into the state machine, calling the second argument
        # (which resets the journal) while nothing reads the log; None: reset the journal only.
        self.install_snapshot: Callable[[Snapshot, Callable[[], None]], None] | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        host, _, port = (self.cfg.listen or self.id).rpartition(":")
        listener = socket.create_server((host, int(port)), backlog=64)  # SO_REUSEADDR on POSIX
        listener.setblocking(False)
        self._listener = listener
        loop = asyncio.get_running_loop()
        self._accepting = loop.create_task(self._accept_loop(listener), name="raft-accept")
        for p in self.core.peers:
            self._links[p] = PeerLink(self.id, p, self.key, self.cfg, self.refused)
        if not self._sync:
            self._flusher = _Flusher(self.storage.journal, self.health, "raft-flush")
        self._tick_handle = loop.call_later(TICK_MS / 1000, self._tick)
        self._report_role()
        self.kick()

    async def stop(self) -> None:
        self._closed = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        if self._accepting is not None:
            self._accepting.cancel()
        for link in self._links.values():
            link.close()
        for t in list(self._inbound):
            t.cancel()
        tasks = [link.task for link in self._links.values()] + list(self._inbound)
        if self._accepting is not None:
            tasks.append(self._accepting)
        if self._finishing is not None:  # not left pending for the loop's close to complain of
            self._finishing.cancel()
            tasks.append(self._finishing)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        if self._flusher is not None:
            self._flusher.close()  # a sync under way finishes before the journal closes
        self._meta_writer.shutdown(wait=True)  # a hint under way finishes before the files close

    # ---- inputs --------------------------------------------------------------------------------

    def propose(self, payloads: list[bytes]) -> tuple[int, int]:
        """On the loop: append entries (NotLeaderError on a follower); the Ready follows."""
        first, term = self.core.propose(payloads)
        self.kick()
        return first, term

    def _tick(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        self._tick_handle = loop.call_later(TICK_MS / 1000, self._tick)
        self.core.tick()
        if self._persist_failing:
            # The Ready is stuck on the disk: what promises nothing about it still leaves (a
            # full leader's heartbeats and its hand-off's TimeoutNow; without them the hand-off
            # waited for an election) and role changes are reported as they happen.
            self._send(self.core.take_leader_messages())
            self._report_role()
        if self._flusher is not None:
            self._maybe_async_flush(self._flusher)
        if self.health.has_corrupt:
            self._ask_for_copies()
        else:
            self._next_repair = 0.0
        if self._on_tick is not None:
            self._on_tick()
        if self.core.has_ready():  # most ticks produce nothing: no callback to schedule then
            self.kick()
        else:
            self._report_role()  # a leader that stepped down on check-quorum says so now

    def _maybe_async_flush(self, flusher: _Flusher) -> None:
        """ASYNC_FLUSH: one group fdatasync at most every flush_interval_ms (acks do not wait),
        on the flusher's thread, one at a time: an fdatasync on a busy disk takes 100s of ms,
        and on the loop it held back heartbeats until the followers elected another leader."""
        if flusher.busy:
            return
        now = time.monotonic()
        if now < self._next_flush or now < flusher.not_before or not self.storage.journal.dirty:
            return
        self._next_flush = now + self.cfg.flush_interval_ms / 1000
        flusher.request()

    # ---- repair of a corrupt record from a peer's copy -------------------------------------------

    def _unreadable_for_peer(self, peer: str, exc: CorruptJournalError) -> None:
        """The core could not read an entry `peer` needs: logged once per (peer, index)."""
        key = (peer, exc.index)
        if key in self._unreadable_logged:
            return
        if len(self._unreadable_logged) >= _MAX_UNREADABLE_LOGGED:
            self._unreadable_logged.clear()  # bounded: at worst a line is repeated
        self._unreadable_logged.add(key)
        log.error(
            "raft.replication_read_failed node=%s peer=%s index=%s path=%s offset=%d reason=%s "
            "action=heartbeats_only_for_this_peer",
            self.id,
            peer,
            exc.index,
            exc.path,
            exc.offset,
            exc.reason.replace(" ", "_"),
        )

    def _ask_for_copies(self) -> None:
        """Once a second while a record is corrupt (the first round a second after it was
        found, so the status shows it), ask every peer for its copy."""
        now = time.monotonic()
        if self._next_repair == 0.0:
            self._next_repair = now + REPAIR_RETRY_S
        if now < self._next_repair:
            return
        self._next_repair = now + REPAIR_RETRY_S
        wanted = sorted(
            {r.index for r in self.health.corrupt_records if r.where == "journal" and r.index}
        )[:_MAX_REPAIRS_ASKED]
        for peer, link in self._links.items():
            if peer not in self.blocked:
                for index in wanted:
                    link.queue(raft_codec.FetchRecord(index))
                link.flush()

    def _answer_fetch(self, peer: str, index: int) -> None:
        """A peer's record failed its check: send ours if it reads back clean."""
        try:
            rec = self.storage.journal.get(index)
        except (RaftLogError, IndexError):  # not here (retention, behind) or bad here too
            copy = raft_codec.RecordCopy(index, 0, None)
        else:
            copy = raft_codec.RecordCopy(index, rec.term, rec.command)
        link = self._links.get(peer)
        if link is not None and peer not in self.blocked:
            link.send(copy)

    def _repair(self, peer: str, copy: raft_codec.RecordCopy) -> None:
        if copy.data is None:
            return  # that peer has no good copy; another may
        if not any(r.index == copy.index for r in self.health.corrupt_records):
            return  # another peer's copy repaired it already
        try:
            path, offset = self.storage.journal.rewrite_sealed(copy.index, copy.term, copy.data)
        except (RaftLogError, IndexError, OSError) as exc:
            log.debug("raft.repair_failed index=%d peer=%s error=%s", copy.index, peer, exc)
            return
        log.warning(
            "raft.record_repaired node=%s index=%d path=%s offset=%d from_peer=%s",
            self.id,
            copy.index,
            path,
            offset,
            peer,
        )
        self.health.repaired(path, offset)

    def step(self, m: Message) -> None:
        if self._closed or m.sender in self.blocked:
            return
        self.core.step(m)
        self.kick()

    # ---- the Ready loop ------------------------------------------------------------------------

    def kick(self) -> None:
        """Handle a Ready soon: every input of this loop turn shares it (one batch, not one
        Ready per message)."""
        if self._scheduled or self._busy or self._closed:
            return
        self._scheduled = True
        self._ready_handle = asyncio.get_running_loop().call_soon(self._start_ready)

    def ready_now(self) -> None:
        """Handle the Ready a kick scheduled now, in the caller's callback, for inputs that come
        from one source at a time: the stream from a follower's leader (after each socket read)
        and the leader's batch of proposals. It saves a loop turn per entry, and in a broker
        every turn may hand the GIL to the dispatcher or the data thread and wait for it back.
        Inputs from several sources (the leader's acks) keep sharing one Ready per turn, but for
        the read whose acks advance the commit index: its Ready answers the committed sends."""
        handle = self._ready_handle
        if self._scheduled and handle is not None:
            handle.cancel()
            self._start_ready()

    def _start_ready(self) -> None:
        self._scheduled = False
        self._ready_handle = None
        if self._busy or self._closed or not self.core.has_ready():
            self._report_role()
            return
        try:
            rd = self.core.ready()
        except Exception:  # a bug: logged loudly; the node must not wedge with _busy set
            log.exception("raft.ready_failed node=%s", self.id)
            return
        self._busy = True
        if self._stamp is not None and rd.leader_messages:  # before the writes (as each below)
            self._stamp("raft.appends_out", rd.entries[-1].index if rd.entries else 0)
        self._send(rd.leader_messages)  # promise nothing about our disk: may leave at once
        self._persist_and_finish(rd)

    def _persist_and_finish(self, rd: Ready) -> None:
        if self._closed:
            return
        try:
            wait = self._persist(rd)
        except OSError as exc:
            self._persist_failed(rd, exc)
            return
        except Exception as exc:  # a bug: loud, and retried like a failed write, never wedged
            log.exception("raft.persist_bug node=%s", self.id)
            self._persist_failed(rd, OSError(f"persist raised {exc!r}"))
            return
        self._persist_failing = False
        if wait is None:
            self._finish(rd)
        else:
            self._finishing = asyncio.get_running_loop().create_task(self._finish_after(rd, wait))

    def _persist_failed(self, rd: Ready, exc: OSError) -> None:
        """Nothing the Ready promised is durable: its votes and acks do not leave. The same
        Ready is persisted again after the health's back-off (a write is idempotent: it
        overwrites from its first index); meanwhile the node says it cannot lead."""
        now = time.monotonic()
        retry_s = self.health.failed("raft persist", str(self.storage.journal.directory), exc, now)
        self._persist_failing = True
        self.core.set_eligible(False)
        leader = self.core.leader
        if leader is not None and leader != self.id:
            # Tell the leader we cannot lead (its transfers pass us over) without promising
            # anything: a refusal of prev 0 is stale to it, only its `eligible` is read.
            c = self.core
            self._send((AppendResponse(self.id, leader, c.term, False, 1, 0, False),))
        loop = asyncio.get_running_loop()
        loop.call_later(max(retry_s, TICK_MS / 1000), self._persist_and_finish, rd)

    def _persist(self, rd: Ready) -> asyncio.Future[None] | None:
        """Steps 1-3 of the contract. Entries go to the journal now (the page cache); the
        fdatasync (SYNC_FLUSH) and a new term or vote (an atomic file) go to the executor, one
        call per Ready, while the loop keeps stepping."""
        st = self.storage
        if rd.snapshot is not None:
            snap = rd.snapshot
            if self.install_snapshot is None:
                st.install(snap)
            else:  # the state machine swaps its state, then has the log reset
                self.install_snapshot(snap, lambda: st.install(snap))
        st.write(rd.entries)
        if self._stamp is not None and rd.entries:
            self._stamp("raft.journal", rd.entries[-1].index)
        durable = self.core.durable_hard_state
        hs = rd.hard_state
        now = time.monotonic()
        # A new term or vote is stored before anything leaves. The commit index is only a
        # restart hint (followers relearn it): stored with a term or vote, or once a second on
        # its own behind the Ready's back, so no ack waits for that fsync (acks waited for it
        # once a second on every node). One writer thread keeps the meta file's writes in
        # order: a hint queued before a new term lands before it, so a term never goes back.
        vote_due = hs is not None and (hs.term, hs.vote) != (durable.term, durable.vote)
        loop = asyncio.get_running_loop()
        if hs is not None and (vote_due or now >= self._next_commit_save):
            self._next_commit_save = now + 1.0
            if not vote_due:
                loop.run_in_executor(self._meta_writer, self._store_hint, hs)
        sync_due = self._sync and bool(rd.entries)
        if not vote_due and not sync_due:
            self.health.succeeded("raft persist", now)
            return None

        def work() -> None:
            if sync_due:
                st.journal.sync()
            if vote_due and hs is not None:
                st.store_hard_state(hs)

        return loop.run_in_executor(self._meta_writer if vote_due else None, work)

    def _store_hint(self, hs: HardState) -> None:
        """The meta writer's thread: a commit hint; a failure costs only a longer replay."""
        try:
            self.storage.store_hard_state(hs)
        except OSError as exc:
            log.debug("raft.commit_hint_not_stored node=%s error=%s", self.id, exc)

    async def _finish_after(self, rd: Ready, wait: asyncio.Future[None]) -> None:
        try:
            await wait
        except OSError as exc:
            self._persist_failed(rd, exc)
            return
        if self._stamp is not None:
            self._stamp("raft.synced", rd.entries[-1].index if rd.entries else 0)
        self.health.succeeded("raft persist", time.monotonic())
        self._finish(rd)

    def _finish(self, rd: Ready) -> None:
        if self._stamp is not None and rd.messages:
            self._stamp_sent(self._stamp, rd.messages)
        self._send(rd.messages)
        if rd.committed:
            self.applied = rd.committed[-1].index
            self._on_committed(rd.committed)
        self.core.advance(rd)
        self._busy = False
        self._report_role()
        if self.core.has_ready():  # inputs that came while busy; else no callback to schedule
            self.kick()

    def _send(self, msgs: tuple[Message, ...]) -> None:
        """A Ready's messages: queued per peer, then one write per peer."""
        if not msgs:
            return
        links, blocked = self._links, self.blocked
        for m in msgs:
            if m.to in blocked:
                continue
            link = links.get(m.to)
            if link is not None:
                link.queue(m)
        for link in links.values():
            link.flush()

    @staticmethod
    def _stamp_sent(stamp: TimelineStamp, msgs: tuple[Message, ...]) -> None:
        """A Ready's acks (what a follower's entries wait for) on the timeline."""
        for m in msgs:
            if isinstance(m, AppendResponse) and m.success:
                stamp("raft.ack_out", m.next_index - 1)

    def _report_role(self) -> None:
        c = self.core
        key = (c.role, c.term, c.leader)
        if key != self._role_key:
            self._role_key = key
            self._on_role(RoleChange(self.id, ROLE_OF[c.role], c.term, c.leader))

    # ---- inbound connections -------------------------------------------------------------------

    async def _accept_loop(self, listener: socket.socket) -> None:
        """Accepts by hand rather than asyncio.start_server(ssl=...): a refused TLS handshake
        there is logged at debug level only, and a plaintext peer would be refused in silence.
        Here the first byte says which protocol the peer speaks before any handshake."""
        loop = asyncio.get_running_loop()
        cap = _MAX_INBOUND_PER_PEER * len(self.core.peers) + _MAX_INBOUND_EXTRA
        while True:
            try:
                conn, addr = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: say it, let the peers retry
                log.warning("raft.accept_failed node=%s error=%s", self.id, exc)
                await asyncio.sleep(_FIRST_RETRY_S)
                continue
            address = str(addr[0])  # the host: a peer reconnects from a new port each time
            if len(self._inbound) >= cap:
                conn.close()
                self.refused(address, "too_many_connections", f"at most {cap} at once")
                continue
            conn.setblocking(False)
            task = loop.create_task(self._accept(conn, address))
            self._inbound.add(task)
            task.add_done_callback(self._inbound.discard)

    def refused(self, address: str, kind: str, hint: str) -> None:
        """A peer connection refused or failed for a reason an operator must fix: one WARNING
        per address and kind every _REFUSAL_LOG_EVERY_S (a peer retries every reconnect_ms)."""
        now = time.monotonic()
        key = (address, kind)
        if now - self._refusals.get(key, -_REFUSAL_LOG_EVERY_S) < _REFUSAL_LOG_EVERY_S:
            return
        if len(self._refusals) >= _MAX_REFUSALS_REMEMBERED:
            self._refusals.clear()  # bounded: at worst a line is repeated
        self._refusals[key] = now
        log.warning(
            'raft.peer_refused node=%s peer=%s reason=%s hint="%s"', self.id, address, kind, hint
        )

    async def _accept(self, conn: socket.socket, address: str) -> None:
        inbound = _Inbound(self)
        try:
            async with asyncio.timeout(_HELLO_TIMEOUT_S):
                reader = await self._open_inbound(conn, address, inbound)
            if reader is None:
                return
            # A peer that has not said who it is within the hello timeout is cut off.
            hello_due = asyncio.get_running_loop().call_later(
                _HELLO_TIMEOUT_S, inbound.hello_overdue
            )
            try:
                await reader.done
            finally:
                hello_due.cancel()
            exc = reader.error
            if isinstance(exc, raft_codec.BadMessageError | FrameTooLargeError):
                log.warning("raft.bad_peer_stream node=%s error=%s", self.id, exc)
            elif exc is not None and not isinstance(exc, OSError):
                raise exc  # a bug below the frames (the core's, the journal's): not swallowed
        except (OSError, TimeoutError):
            pass
        finally:
            if inbound.reader is not None and inbound.reader.transport is not None:
                inbound.reader.transport.close()
            else:
                conn.close()
            if inbound.sender is not None and not self._closed:
                # A leader killed outright closes its connections as it dies: the core need
                # not wait out an election timeout to notice (failover in ~0.1 s, not ~0.3).
                self.core.peer_disconnected(inbound.sender)

    async def _open_inbound(
        self, conn: socket.socket, address: str, inbound: _Inbound
    ) -> FrameReader | None:
        """The connection read frame by frame into `inbound`, after its TLS handshake when this
        node has TLS; None when the peer speaks the other protocol (refused, logged)."""
        loop = asyncio.get_running_loop()
        tls = self.cfg.tls
        first = await _peek_first_byte(loop, conn)
        if not first:
            return None  # closed before saying anything (a port probe)
        if tls is not None and not raft_codec.looks_like_tls(first):
            self.refused(
                address,
                "plaintext_peer_on_tls_port",
                "this node's Raft port is TLS: give every node of the group the same --tls-* "
                "flags ([security.tls] in the cluster description)",
            )
            return None
        if tls is None and raft_codec.looks_like_tls(first):
            self.refused(
                address,
                "tls_peer_on_plaintext_port",
                "the peer has TLS on and this node has not: give every node the same --tls-* flags",
            )
            return None
        reader = FrameReader(inbound.on_frame, _MAX_HELLO_BYTES, on_read=inbound.on_read)
        inbound.reader = reader
        try:
            await loop.connect_accepted_socket(
                lambda: reader,
                conn,
                ssl=tls.server if tls is not None else None,
                ssl_handshake_timeout=_HELLO_TIMEOUT_S if tls is not None else None,
            )
        except ssl.SSLError as exc:
            inbound.reader = None
            self.refused(
                address,
                f"tls_handshake_failed error={_ssl_reason(exc)}",
                "the peer needs a certificate of this group's CA (--tls-cert, --tls-key)",
            )
            return None
        return reader

    def accept_hello(self, hello: bytes) -> tuple[str, raft_codec.Sealer | None]:
        """The sender a peer's hello names, and the opener of its frames when they are sealed;
        BadMessageError when it is not a member or does not prove this group's password."""
        h = raft_codec.decode_hello(hello)
        sender = h.sender
        if sender not in self.core.peers:
            raise raft_codec.BadMessageError(f"{sender!r} is not a member of this group")
        if h.mode != self.mode:
            raise raft_codec.BadMessageError(
                f"{sender} {_MODE_TEXT[h.mode]} and this node {_MODE_TEXT[self.mode]}: set the "
                "same Raft password (raft.key) on every node"
            )
        if self.key is not None and h.mode == raft_codec.PROVED:
            expected = raft_codec.hello_proof(self.key, h.nonce, sender)
            if not hmac.compare_digest(h.proof, expected):
                raise raft_codec.BadMessageError(
                    f"{sender}'s hello does not prove the Raft password: is raft.key the same "
                    "on every node?"
                )
        opener = None
        if self.key is not None and h.mode == raft_codec.SEALED:
            opener = raft_codec.Sealer(self.key, h.nonce)
        said = features_of(h.nonce)
        if self.peer_features.get(sender) != said:
            self.peer_features = {**self.peer_features, sender: said}
        return sender, opener

    def receive(self, sender: str, m: raft_codec.Frame) -> None:
        """One message from an accepted peer."""
        stamp = self._stamp
        if stamp is not None:
            if isinstance(m, AppendEntries) and m.entries:
                stamp("raft.append_in", m.entries[-1].index)
            elif isinstance(m, AppendResponse) and m.success:
                stamp("raft.ack_in", m.next_index - 1)
        if isinstance(m, raft_codec.FetchRecord):
            self._answer_fetch(sender, m.index)
        elif isinstance(m, raft_codec.RecordCopy):
            self._repair(sender, m)
        else:
            self.step(m)


class _Inbound:
    """One inbound connection's frames: its hello first (who, and whether sealed), then
    messages, each handled in the read callback that completed it."""

    def __init__(self, node: RaftNodeShell) -> None:
        self._node = node
        self._sender: str | None = None
        self._opener: raft_codec.Sealer | None = None
        self.reader: FrameReader | None = None

    @property
    def sender(self) -> str | None:
        """The member this connection comes from, once its hello was accepted."""
        return self._sender

    def on_frame(self, body: bytes | bytearray) -> None:
        if self._sender is None:
            self._sender, self._opener = self._node.accept_hello(bytes(body))
            assert self.reader is not None
            self.reader.limit = raft_codec.MAX_FRAME_BYTES  # a member now: whole entries
            return
        if self._opener is not None:
            body = self._opener.open(body)
        self._node.receive(self._sender, raft_codec.decode(body, self._sender, self._node.id))

    def on_read(self) -> None:
        """After one socket read's frames: a follower handles its leader's input at once, and
        so does a leader whose commit index the read's acks advanced (the Ready that answers
        the committed sends, without a loop turn and a hand-off of the GIL first: the W2
        send's timeline, bench/w2_timeline.py). Acks that commit nothing new keep sharing one
        Ready per turn."""
        node = self._node
        core = node.core
        if core.role is not Role.LEADER or core.commit > core.applied:
            node.ready_now()

    def hello_overdue(self) -> None:
        if self._sender is None and self.reader is not None:
            self.reader.fail(TimeoutError("no hello within the hello timeout"))


async def _peek_first_byte(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The connection's first byte, left in the socket for whoever reads it next."""
    while True:
        try:
            return conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            pass
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(conn.fileno(), _resolve_once, ready)
        try:
            await ready
        finally:
            loop.remove_reader(conn.fileno())


def _resolve_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _ssl_reason(exc: ssl.SSLError) -> str:
    """OpenSSL's short reason (WRONG_VERSION_NUMBER, CERTIFICATE_VERIFY_FAILED...), one word."""
    return str(exc.reason or type(exc).__name__).replace(" ", "_")
