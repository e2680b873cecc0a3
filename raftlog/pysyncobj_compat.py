"""Every touch of pysyncobj's internals lives here, behind an exact version check.

pysyncobj runs elections; this module replaces what it gets wrong for a message store: the
journal (ours, on disk, checksummed), the wire (protocol 5, no zlib), log replication (monotonic
nextIndex, no truncation of matching entries, per-peer flow control) and compaction (never: the
journal is the CommitLog). The replication rules themselves are pure functions in replication.py;
the handlers here gather their inputs and do the I/O they decide. Nothing outside raftlog/ may
import this module.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import pysyncobj
import pysyncobj.pickle
import pysyncobj.syncobj
import pysyncobj.tcp_server
import pysyncobj.transport
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import FAIL_REASON
from pysyncobj.journal import Journal
from pysyncobj.monotonic import monotonic as _pysyncobj_monotonic
from pysyncobj.version import VERSION

from raftmq.raftlog.config import FlushPolicy, RaftLogConfig
from raftmq.raftlog.election import (
    LogPosition,
    PeerView,
    PreVoteReply,
    PreVoteRequest,
    PreVoteRound,
    VoterState,
    cannot_take_over,
    grant_pre_vote,
    pre_vote_term,
    transfer_candidates,
)
from raftmq.raftlog.errors import CommittedEntryConflictError, CorruptJournalError, RaftLogError
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore, RaftMeta
from raftmq.raftlog.record import Role
from raftmq.raftlog.replication import (
    Ack,
    AppendRequest,
    Progress,
    follower_append,
    leader_on_ack,
)
from raftmq.raftlog.storage_health import StorageHealth

PINNED_VERSION = "0.3.17"
if VERSION != PINNED_VERSION:  # the overrides below name mangled private members of this release
    raise ImportError(
        f"raftlog needs pysyncobj=={PINNED_VERSION} exactly, found {VERSION}: "
        "its private members are patched here; re-check every override before moving the pin"
    )

log = logging.getLogger("raftlog.raft")

# pysyncobj's states and command types (syncobj.py: _RAFT_STATE, _COMMAND_TYPE).
_FOLLOWER, _CANDIDATE, _LEADER = 0, 1, 2
ROLE_OF_STATE = {_FOLLOWER: Role.FOLLOWER, _CANDIDATE: Role.CANDIDATE, _LEADER: Role.LEADER}
_MAX_APPLY_BYTES = 8 << 20  # entries read per apply step, so one tick never materialises the log
_MAX_APPLY_COUNT = 4096
_MAX_SEND_COUNT = 4096
_NEVER = 1 << 62
_NOOP_COMMAND = bytes([1])  # pysyncobj's _COMMAND_TYPE.NO_OP as its journal stores it
_PRE_VOTE = "rm_pre_vote"  # PreVote (election.py); older nodes ignore unknown message types
_PRE_VOTE_REPLY = "rm_pre_vote_reply"
_CANNOT_WRITE = "rm_cannot_write"  # key of a follower's ack: its disk refuses writes
_FETCH = "rm_fetch_record"  # repair: "send me your copy of entry i" (older nodes ignore it)
_FETCH_REPLY = "rm_fetch_record_reply"
REPAIR_RETRY_S = 1.0  # a corrupt record's copy is asked of every peer this often until repaired
_MAX_REPAIRS_ASKED = 16  # records asked for per round (the rest wait for the next rounds)
_MAX_UNREADABLE_LOGGED = 1024  # (peer, index) pairs remembered so each is logged once
_LOW_SPACE_BYTES = 1 << 20  # a follower with less free space reports it cannot write
# A follower sent a TimeoutNow that did not take over is passed over this long (others first).
TRANSFER_PASS_OVER_S = 1.0
EXIT_INVARIANT_VIOLATED = 70  # EX_SOFTWARE: a broken Raft invariant stopped the process


def raft_clock() -> float:
    """pysyncobj's clock (CLOCK_MONOTONIC_RAW on Linux), not time.monotonic(): every time
    compared with pysyncobj's own fields (election deadline, next heartbeat, last response)
    must come from it. The two clocks drift apart with uptime (0.23 s after 6 h measured here),
    and mixing them skewed heartbeats (every ~280 ms instead of 50) and election timeouts."""
    return float(_pysyncobj_monotonic())


_patch_lock = threading.Lock()
_patched = False


def install_patches() -> None:
    """Process-wide switches; every raftmq process installs them before creating a node."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        from raftmq.raftlog.wire import FramedConnection

        # Protocol 5: bytes are not round-tripped through latin-1 str (research/raft.md 2).
        setattr(pysyncobj.pickle, "__protocol", 5)
        original_create = pysyncobj.syncobj.createJournal

        def create_journal(journal_file: Any = None) -> Any:
            # Our nodes pass the journal object itself through SyncObjConf.journalFile.
            if isinstance(journal_file, Journal):
                return journal_file
            return original_create(journal_file)

        pysyncobj.syncobj.createJournal = create_journal
        pysyncobj.transport.TcpConnection = FramedConnection
        pysyncobj.tcp_server.TcpConnection = FramedConnection
        _patched = True


class JournalAdapter(Journal):  # type: ignore[misc]  # pysyncobj is untyped
    """pysyncobj's Journal interface over SegmentJournal + MetaStore.

    pysyncobj indexes its journal like a list (position 0 = first entry); our overrides read by
    Raft index instead, so only `[0]`, `[-1]`, `len()` and `add()` remain on pysyncobj's side.
    """

    def __init__(
        self, journal: SegmentJournal, meta_store: MetaStore, health: StorageHealth | None = None
    ) -> None:
        self.journal = journal
        self.health = health if health is not None else StorageHealth(str(journal.directory))
        self._meta_store = meta_store
        self._meta = meta_store.load()
        self._commit_index = self._meta.commit_index
        self._commit_saved = self._commit_index
        # The last meta store failed: retried once a second even if nothing changed since, so
        # an idle node's storage episode closes once the disk takes writes again.
        self._meta_unsaved = False

    def add(self, command: bytes, idx: int, term: int) -> None:
        try:
            self.journal.append(idx, term, command)
        except OSError as exc:  # the leader's append: RaftNode._onTick ends the tick quietly
            self.health.failed("journal", str(self.journal.directory), exc, time.monotonic())
            raise

    def clear(self) -> None:
        raise RuntimeError("raftlog journals are never cleared by pysyncobj (snapshots are off)")

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self.journal.truncate_suffix(self.journal.first_index + entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:
        raise RuntimeError("raftlog journals are never compacted by pysyncobj (snapshots are off)")

    def __getitem__(self, item: int) -> tuple[bytes, int, int]:
        if not isinstance(item, int):
            raise TypeError("raftlog journal positions are ints; slices go through the overrides")
        j = self.journal
        if item in (0, -1) and len(j) == 0 and j.has_base:
            # Just after a snapshot install: pysyncobj reads its last index and term from the
            # last entry; the base (first_index - 1) stands in for it until entries arrive.
            base = j.first_index - 1
            return (_NOOP_COMMAND, base, j.term_at(base))
        index = j.first_index + item if item >= 0 else j.last_index + 1 + item
        r = j.get(index)
        return (r.command, r.index, r.term)

    def __len__(self) -> int:
        # An empty journal with a base counts its base: pysyncobj appends a fresh no-op at
        # index 1 to an empty journal when it starts.
        n = len(self.journal)
        return n if n or not self.journal.has_base else 1

    def _destroy(self) -> None:
        self.onOneSecondTimer()
        self.journal.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit_index = raftCommitIndex

    def getRaftCommitIndex(self) -> int:
        # A torn tail can leave the stored commit index past the journal's end.
        return max(1, min(self._commit_index, self.journal.last_index))

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        # Raft: term and vote are durable before any message that reflects them is sent.
        meta = RaftMeta(term, votedForNodeId, self._commit_index)
        try:
            self._meta_store.store(meta)
        except OSError as exc:  # nothing is sent: the vote or the election does not happen
            self.health.failed("raft meta", str(self._meta_store.path), exc, time.monotonic())
            self._meta_unsaved = True
            raise
        self.health.succeeded("raft meta", time.monotonic())
        self._meta_unsaved = False
        self._meta = meta
        self._commit_saved = self._commit_index

    def getCurrentTerm(self) -> int:
        return self._meta.current_term

    def getVotedForNodeId(self) -> str | None:
        return self._meta.voted_for

    def onOneSecondTimer(self) -> None:
        # The commit index is only a restart hint (followers relearn it): once a second is enough.
        if self._commit_index != self._commit_saved or self._meta_unsaved:
            now = time.monotonic()
            if not self.health.may_try("raft meta", now):
                return
            meta = RaftMeta(self._meta.current_term, self._meta.voted_for, self._commit_index)
            try:
                self._meta_store.store(meta)
            except OSError as exc:  # a hint only: kept in memory, stored once the disk takes it
                self.health.failed("raft meta", str(self._meta_store.path), exc, now)
                self._meta_unsaved = True
                return
            self.health.succeeded("raft meta", now)
            self._meta_unsaved = False
            self._meta = meta
            self._commit_saved = self._commit_index


@dataclass(frozen=True, slots=True)
class NodeView:
    """A consistent-enough read of the node's Raft state for status and role tracking."""

    role: Role
    term: int
    leader: str | None
    commit_index: int
    applied_index: int
    noop_index: int | None
    match_index: dict[str, int]


def make_conf(cfg: RaftLogConfig, journal: JournalAdapter) -> SyncObjConf:
    return SyncObjConf(
        bindAddress=cfg.node_id,
        password=cfg.password,
        journalFile=journal,
        # Send on every new entry (ms latency); group commit above makes entries big.
        appendEntriesUseBatch=False,
        appendEntriesPeriod=cfg.heartbeat_ms / 1000,
        autoTickPeriod=min(0.01, cfg.heartbeat_ms / 4000),
        appendEntriesBatchSizeBytes=cfg.batch_max_bytes * 2,
        sendBufferSize=4 << 20,
        recvBufferSize=4 << 20,
        raftMinTimeout=cfg.election_timeout_min_ms / 1000,
        raftMaxTimeout=cfg.election_timeout_max_ms / 1000,
        leaderFallbackTimeout=cfg.leader_fallback_ms / 1000,
        connectionTimeout=cfg.connection_timeout_ms / 1000,
        connectionRetryTime=cfg.reconnect_ms / 1000,
        # The journal is the CommitLog: pysyncobj must never snapshot or compact it.
        logCompactionMinEntries=_NEVER,
        logCompactionMinTime=_NEVER,
        commandsQueueSize=100_000,
        commandsWaitLeader=False,
        maxBindRetries=15,  # the stock default retries forever, silently, on a busy port
        bindRetryTime=0.2,
        dynamicMembershipChange=False,
    )


def stop_process(node_id: str, error: RaftLogError) -> NoReturn:
    """The default response to a broken Raft invariant: log it, then end the process at once.

    Why os._exit and not an exception or a graceful stop: this runs in pysyncobj's tick thread,
    whose loop logs and swallows exceptions and ticks again (the node would keep serving); a
    graceful stop runs the broker's shutdown path, which answers in-flight calls and may hand off
    leadership, i.e. keeps acting on a log known to be wrong. Nothing is lost by not unwinding:
    this handler has written nothing, and the journal's unsynced bytes are in the page cache. A
    supervisor that restarts the process sees it stop again at the same entry, so it stays down
    and loud until an operator repairs the data directory (etcd panics the same way).
    """
    log.critical(
        "raft.invariant_violated node=%s error=%s exit_code=%d action=stopping_process",
        node_id,
        error,
        EXIT_INVARIANT_VIOLATED,
    )
    for handler in (*logging.getLogger().handlers, *log.handlers):
        with contextlib.suppress(Exception):  # the exit must happen even if a handler is broken
            handler.flush()
    os._exit(EXIT_INVARIANT_VIOLATED)


class RaftNode(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    """A pysyncobj node whose replication path is ours. Methods named `_SyncObj__x` override
    pysyncobj's private `__x` (name mangling makes that the attribute pysyncobj looks up)."""

    # pysyncobj's private state that the overrides read and write (declared for the type checker).
    _SyncObj__raftLastApplied: int
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftLeader: Any

    def __init__(
        self,
        cfg: RaftLogConfig,
        journal: JournalAdapter,
        on_tick: Callable[[], None],
        on_fatal: Callable[[str, RaftLogError], None] = stop_process,
    ) -> None:
        install_patches()
        # Everything the overrides use must exist before SyncObj.__init__ starts the tick thread.
        self._rm_cfg = cfg
        self._rm_on_fatal = on_fatal  # a broken invariant: stop_process unless a test says so
        self._rm_journal = journal.journal
        self._rm_health = journal.health
        self._rm_sync_flush = cfg.flush_policy is FlushPolicy.SYNC_FLUSH
        self._rm_restart_commit: int | None = journal.getRaftCommitIndex()
        self._rm_max_inflight = cfg.max_inflight_bytes_per_peer
        self._rm_send_bytes = cfg.batch_max_bytes * 2
        self._rm_warned_gap: set[str] = set()
        self._rm_unreadable_logged: set[tuple[str, int | None]] = set()  # (peer, index) logged
        self._rm_tick_calls: collections.deque[Callable[[], None]] = collections.deque(maxlen=64)
        # PreVote state (tick thread): the round this node runs, the last time a leader spoke to
        # it, and whether a won round lets the next expired election timer start a real election.
        self._rm_members = frozenset(cfg.members)
        self._rm_min_timeout_s = cfg.election_timeout_min_ms / 1000
        self._rm_round: PreVoteRound | None = None
        self._rm_round_seq = 0
        self._rm_heard_term = 0  # the highest term pre-vote answers carried (memory only)
        self._rm_election_allowed = False
        self._rm_leader_contact: float | None = None
        # Leadership transfer (tick thread): what followers report of their disks, which were
        # sent a TimeoutNow and when (one that did not take over is skipped for a while).
        self._rm_peer_cannot_write: dict[str, bool] = {}
        self._rm_transfer_tried: dict[str, float] = {}
        self._rm_low_space = False
        self._rm_next_space_check = 0.0
        self._rm_blocked: frozenset[str] = frozenset()
        self._rm_send_filter_installed = False
        super().__init__(cfg.node_id, list(cfg.peers), make_conf(cfg, journal))
        transport = self._SyncObj__transport
        for name in ("add", "remove", "set_version"):  # unauthenticated admin commands: refused
            transport.setOnUtilityMessageCallback(name, _refuse_utility)
        self._rm_next_repair = 0.0
        self.addOnTickCallback(self._rm_run_tick_calls)
        self.addOnTickCallback(self._rm_repair_tick)
        self.addOnTickCallback(on_tick)

    # ---- API used by ReplicatedLog (any thread) ----------------------------------------------

    def submit_command(self, command: bytes, callback: Callable[[Any, int], None]) -> None:
        # A full wake-up pipe means a wake-up is already pending; the command is queued anyway.
        with contextlib.suppress(BlockingIOError):
            self._applyCommand(command, callback)

    def is_leader(self) -> bool:
        return bool(self._SyncObj__raftState == _LEADER)

    def leader_id(self) -> str | None:
        leader = self._SyncObj__raftLeader
        return leader.id if leader is not None else None

    def applying_index(self) -> int:
        """Index of the entry being applied; valid only inside a commit callback (tick thread):
        pysyncobj runs callbacks before it advances raftLastApplied."""
        return int(self._SyncObj__raftLastApplied) + 1

    def applied_index(self) -> int:
        return int(self._SyncObj__raftLastApplied)

    def role_key(self) -> tuple[int, int, str | None]:
        return (self._SyncObj__raftState, self._SyncObj__raftCurrentTerm, self.leader_id())

    def view(self) -> NodeView:
        leader = self._SyncObj__raftLeader
        return NodeView(
            role=ROLE_OF_STATE[self._SyncObj__raftState],
            term=self._SyncObj__raftCurrentTerm,
            leader=leader.id if leader is not None else None,
            commit_index=self._SyncObj__raftCommitIndex,
            applied_index=self._SyncObj__raftLastApplied,
            noop_index=self._SyncObj__noopIDx,
            match_index={n.id: i for n, i in list(self._SyncObj__raftMatchIndex.items())},
        )

    def transfer_to(self, node_id: str | None, timeout_s: float = 2.0) -> bool:
        """Ask a caught-up follower to take over (Raft TimeoutNow). True if the request was sent.

        pysyncobj's transport is not thread-safe, so the request runs in the tick thread."""
        done = threading.Event()
        result: list[bool] = []

        def cb(res: Any, err: int) -> None:
            result.append(err == FAIL_REASON.SUCCESS)
            done.set()

        self._rm_tick_calls.append(lambda: self.transferLeadership(node=node_id, callback=cb))
        done.wait(timeout_s)
        return bool(result and result[0])

    def transfer_to_best(self, timeout_s: float = 2.0) -> str:
        """Send a TimeoutNow to the best follower that can take over now (election.py's
        transfer_candidates). Returns "sent", "wait" (one was asked a moment ago, or the best
        one is catching up) or "none" (no follower can take over)."""
        done = threading.Event()
        result: list[str] = []

        def run() -> None:
            try:
                result.append(self._rm_transfer_best())
            finally:
                done.set()

        self._rm_tick_calls.append(run)
        done.wait(timeout_s)
        return result[0] if result else "wait"

    def request_transfer_best(self) -> None:
        """transfer_to_best without waiting for the answer (any thread)."""

        def run() -> None:
            self._rm_transfer_best()

        self._rm_tick_calls.append(run)

    def cannot_take_over(self, node_id: str) -> str | None:
        """Why follower `node_id` could not take over now (not connected, not answering, its
        disk refuses writes), or None. Any thread: reads the leader's view without locking."""
        for p in self._rm_peer_views(raft_clock()):
            if p.node_id == node_id:
                return cannot_take_over(p, self._rm_min_timeout_s)
        return "not_a_member"

    def set_blocked_peers(self, peers: frozenset[str]) -> None:
        """Fault injection for tests and drills: drop every raft message to and from `peers`
        while the connections stay up, as a firewall rule dropping packets would (a node cut off
        this way keeps its timers running). An empty set restores normal traffic."""
        self._rm_tick_calls.append(lambda: self._rm_block(peers))

    def _rm_run_tick_calls(self) -> None:
        while self._rm_tick_calls:
            self._rm_tick_calls.popleft()()

    # ---- overrides (tick thread) ----------------------------------------------------------------

    def _onTick(self, timeToWait: float = 0.0) -> None:
        health = self._rm_health
        if health.error is not None and self._SyncObj__raftState != _LEADER:
            # A node that cannot write does not stand for election (a TimeoutNow included):
            # it would lead a group it cannot append to. Its vote for others is unaffected.
            self._SyncObj__raftElectionDeadline = (
                raft_clock() + self._SyncObj__generateRaftTimeout()
            )
        self._rm_pre_vote_tick()
        try:
            SyncObj._onTick(self, timeToWait)
        except OSError:
            # A write the disk refused (the writer told StorageHealth, which logs once per
            # episode): no traceback per tick. Queued commands were never appended: refuse them.
            if (
                self._SyncObj__raftState == _LEADER
                and self._SyncObj__raftCurrentTerm != self._SyncObj__raftLog.getCurrentTerm()
            ):
                # A higher term was seen but could not be stored, so pysyncobj never stepped
                # down: do it here (always safe), or this node would claim a term it never won.
                self._SyncObj__setState(_FOLLOWER)
                self._SyncObj__raftLeader = None
            self._rm_refuse_queued()

    # ---- PreVote (tick thread) -------------------------------------------------------------

    def _rm_log_position(self) -> LogPosition:
        return LogPosition(self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())

    def _rm_pre_vote_tick(self) -> None:
        """Runs before pysyncobj's tick: an expired election timer starts a pre-vote round
        instead of an election (term and vote untouched), unless a round was just won or the
        leader asked this node to take over (TimeoutNow skips PreVote, thesis 3.10)."""
        if self._SyncObj__raftState == _LEADER or self._SyncObj__transferInProgress:
            return
        now = raft_clock()
        if self._SyncObj__raftElectionDeadline >= now:
            return
        if self._SyncObj__raftLeader is not None:
            # No word from the leader for a whole election timeout: this node no longer knows
            # one, whether or not it can start a round. (pysyncobj clears it only when it
            # starts an election, which it never does cut off from everyone, and a pre-vote
            # round does not: such a follower named a dead leader to /readyz and status.)
            self._SyncObj__onLeaderChanged()
            self._SyncObj__raftLeader = None
        if self._rm_election_allowed:
            self._rm_election_allowed = False  # pysyncobj's tick below starts the election
            return
        if not self._SyncObj__connectedToAnyone():
            return  # pysyncobj would not start an election either
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        self._rm_round_seq += 1
        rnd = PreVoteRound(
            self._rm_cfg.node_id,
            self._rm_round_seq,
            pre_vote_term(self._SyncObj__raftCurrentTerm, self._rm_heard_term),
            self._rm_members,
        )
        self._rm_round = rnd
        if rnd.won:  # a group of one
            self._rm_start_election(rnd)
            return
        req = rnd.request(self._rm_log_position())
        message = {
            "type": _PRE_VOTE,
            "round_id": req.round_id,
            "term": req.term,
            "last_log_term": req.log.last_term,
            "last_log_index": req.log.last_index,
        }
        for node in self._SyncObj__otherNodes:
            self._SyncObj__transport.send(node, message)

    def _rm_start_election(self, rnd: PreVoteRound) -> None:
        """A won round: the next tick runs pysyncobj's election at the round's term (pysyncobj
        adds one to the current term: a term that lagged is first brought to one below)."""
        self._rm_round = None
        if self._SyncObj__raftState == _LEADER:
            return
        if rnd.term - 1 > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(rnd.term - 1, None)
        self._rm_election_allowed = True
        self._SyncObj__raftElectionDeadline = 0

    def _rm_on_pre_vote(self, node: Any, msg: dict[str, Any]) -> None:
        now = raft_clock()
        contact = self._rm_leader_contact
        voter = VoterState(
            node_id=self._rm_cfg.node_id,
            term=self._SyncObj__raftCurrentTerm,
            is_leader=self._SyncObj__raftState == _LEADER,
            log=self._rm_log_position(),
            leader_contact_age_s=None if contact is None else now - contact,
            min_election_timeout_s=self._rm_min_timeout_s,
        )
        req = PreVoteRequest(
            node.id,
            int(msg["round_id"]),
            int(msg["term"]),
            LogPosition(int(msg["last_log_term"]), int(msg["last_log_index"])),
        )
        reply = grant_pre_vote(voter, req)
        log.log(
            logging.INFO if reply.granted else logging.DEBUG,
            "raft.pre_vote_answer node=%s candidate=%s granted=%s term=%d asked_term=%d "
            "log=%d/%d candidate_log=%d/%d leader_contact_age_s=%s",
            self._rm_cfg.node_id,
            node.id,
            reply.granted,
            voter.term,
            req.term,
            voter.log.last_term,
            voter.log.last_index,
            req.log.last_term,
            req.log.last_index,
            "never" if voter.leader_contact_age_s is None else f"{voter.leader_contact_age_s:.3f}",
        )
        self._SyncObj__transport.send(
            node,
            {
                "type": _PRE_VOTE_REPLY,
                "round_id": reply.round_id,
                "granted": reply.granted,
                "term": reply.term,
            },
        )

    def _rm_on_pre_vote_reply(self, node: Any, msg: dict[str, Any]) -> None:
        rnd = self._rm_round
        if rnd is None or self._SyncObj__raftState == _LEADER:
            return
        reply = PreVoteReply(node.id, int(msg["round_id"]), bool(msg["granted"]), int(msg["term"]))
        self._rm_heard_term = max(self._rm_heard_term, reply.term)  # the next round asks above it
        if rnd.on_reply(reply):
            log.info(
                "raft.pre_vote_won node=%s term=%d election_term=%d granted=%s",
                self._rm_cfg.node_id,
                self._SyncObj__raftCurrentTerm,
                rnd.term,
                ",".join(sorted(rnd.granted)),
            )
            self._rm_start_election(rnd)

    # ---- leadership transfer (tick thread) --------------------------------------------------

    def _rm_peer_views(self, now: float) -> list[PeerView]:
        connected = self._SyncObj__connectedNodes
        match_index = self._SyncObj__raftMatchIndex
        responded = self._SyncObj__lastResponseTime
        return [
            PeerView(
                node_id=n.id,
                connected=n in connected,
                match_index=match_index.get(n, 0),
                response_age_s=now - responded.get(n, float("-inf")),
                can_write=not self._rm_peer_cannot_write.get(n.id, False),
            )
            for n in list(self._SyncObj__otherNodes)
        ]

    def _rm_transfer_best(self) -> str:
        if self._SyncObj__raftState != _LEADER:
            return "none"
        now = raft_clock()
        last = self._SyncObj__getCurrentLogIndex()
        order = transfer_candidates(
            self._rm_peer_views(now),
            last_index=last,
            reachable_s=self._rm_min_timeout_s,
            tried=self._rm_transfer_tried,
            in_flight_s=self._rm_min_timeout_s,
            pass_over_s=TRANSFER_PASS_OVER_S,
            now=now,
        )
        if order is None:
            return "wait"
        if not order:
            return "none"
        node = next(n for n in self._SyncObj__otherNodes if n.id == order[0])
        if self._SyncObj__raftMatchIndex.get(node, 0) != last:
            return "wait"  # the best one is still catching up (writes are paused meanwhile)
        self._rm_transfer_tried[node.id] = now
        log.info("raft.transfer_leadership node=%s to=%s", self._rm_cfg.node_id, node.id)
        self._SyncObj__transport.send(
            node, {"type": "timeout_now", "term": self._SyncObj__raftCurrentTerm}
        )
        return "sent"

    def _rm_cannot_write(self) -> bool:
        """This node's disk refuses writes, or (probed once a second) has no space left: what a
        follower reports in its acks so a leader does not pick it to take over."""
        now = time.monotonic()
        if now >= self._rm_next_space_check:
            self._rm_next_space_check = now + 1.0
            try:
                st = os.statvfs(self._rm_journal.directory)
                self._rm_low_space = st.f_bavail * st.f_frsize < _LOW_SPACE_BYTES
            except OSError:
                self._rm_low_space = False
        return self._rm_health.error is not None or self._rm_low_space

    def _SyncObj__sendNextNodeIdx(
        self,
        node: Any,
        reset: bool = False,
        nextNodeIdx: int | None = None,
        success: bool = False,
    ) -> None:
        # pysyncobj's ack plus whether this node can write (older leaders ignore the extra key).
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        message = {
            "type": "next_node_idx",
            "next_node_idx": nextNodeIdx,
            "reset": reset,
            "success": success,
        }
        if self._rm_cannot_write():
            message[_CANNOT_WRITE] = True
        self._SyncObj__transport.send(node, message)

    # ---- repair from peers (tick thread) ----------------------------------------------------

    def _rm_repair_tick(self) -> None:
        """Ask every connected peer for its copy of each corrupt journal record, once a
        second while any waits (a peer answers from its own checked read)."""
        health = self._rm_health
        if not health.has_corrupt:
            return
        now = time.monotonic()
        if now < self._rm_next_repair:
            return
        self._rm_next_repair = now + REPAIR_RETRY_S
        wanted = sorted(
            {r.index for r in health.corrupt_records if r.where == "journal" and r.index}
        )[:_MAX_REPAIRS_ASKED]
        connected = self._SyncObj__connectedNodes
        for node in list(self._SyncObj__otherNodes):
            if node in connected:
                for index in wanted:
                    self._SyncObj__transport.send(node, {"type": _FETCH, "index": index})

    def _rm_on_fetch(self, node: Any, msg: dict[str, Any]) -> None:
        index = int(msg["index"])
        try:
            rec = self._rm_journal.get(index)
        except (RaftLogError, IndexError):  # not here (retention, behind) or bad here too
            self._SyncObj__transport.send(node, {"type": _FETCH_REPLY, "index": index})
            return
        self._SyncObj__transport.send(
            node,
            {"type": _FETCH_REPLY, "index": index, "term": rec.term, "command": rec.command},
        )

    def _rm_on_fetch_reply(self, node: Any, msg: dict[str, Any]) -> None:
        if "command" not in msg:
            return  # that peer has no good copy; another may
        index, term = int(msg["index"]), int(msg["term"])
        try:
            path, offset = self._rm_journal.rewrite_sealed(index, term, bytes(msg["command"]))
        except (RaftLogError, IndexError, OSError) as exc:
            log.debug("raft.repair_failed index=%d peer=%s error=%s", index, node.id, exc)
            return
        log.warning(
            "raft.record_repaired node=%s index=%d path=%s offset=%d from_peer=%s",
            self._rm_cfg.node_id,
            index,
            path,
            offset,
            node.id,
        )
        self._rm_health.repaired(path, offset)

    # ---- fault injection --------------------------------------------------------------------

    def _rm_block(self, peers: frozenset[str]) -> None:
        self._rm_blocked = frozenset(peers)
        if self._rm_send_filter_installed or not peers:
            return
        transport = self._SyncObj__transport
        send = transport.send

        def filtered_send(node: Any, message: Any) -> Any:
            if self._rm_blocked and getattr(node, "id", None) in self._rm_blocked:
                return None
            return send(node, message)

        transport.send = filtered_send  # an instance attribute: pysyncobj looks it up per send
        self._rm_send_filter_installed = True

    def _rm_refuse_queued(self) -> None:
        commands = self._SyncObj__commandsQueue
        for _ in range(self._SyncObj__conf.commandsQueueSize):
            try:
                _command, callback = commands.get_nowait()
            except Exception:  # pysyncobj's queue raises its own Empty: nothing left
                return
            if callable(callback):
                callback(None, FAIL_REASON.NOT_LEADER)

    def _SyncObj__getEntries(
        self, fromIDx: int | None, count: int | None = None, maxSizeBytes: int | None = None
    ) -> list[tuple[bytes, int, int]]:
        j = self._rm_journal
        if fromIDx is None or fromIDx < j.first_index or fromIDx > j.last_index:
            return []
        try:
            records = j.read_range(
                fromIDx,
                max_bytes=maxSizeBytes if maxSizeBytes is not None else _MAX_APPLY_BYTES,
                max_count=min(count if count is not None else _MAX_APPLY_COUNT, _MAX_APPLY_COUNT),
            )
        except CorruptJournalError:
            # Reported by the journal. pysyncobj reads entries to apply them and to check the
            # commit term: both wait (an empty answer) instead of failing the whole tick.
            return []
        return [(r.command, r.index, r.term) for r in records]

    def _SyncObj__applyLogEntries(self) -> bool:
        if self._rm_restart_commit is not None:
            # Applying is a no-op for our entries (readers read the journal), so a restart resumes
            # at the stored commit index instead of re-reading the whole CommitLog.
            start = self._rm_restart_commit
            self._rm_restart_commit = None
            if start > self._SyncObj__raftLastApplied:
                self._SyncObj__raftLastApplied = start
                self._SyncObj__raftCommitIndex = max(self._SyncObj__raftCommitIndex, start)
        return bool(SyncObj._SyncObj__applyLogEntries(self))

    def _SyncObj__tryLogCompaction(self) -> None:
        return None

    def _SyncObj__onBecomeLeader(self) -> None:
        self._rm_transfer_tried.clear()  # a new reign: every follower may be asked again
        self._rm_round = None
        SyncObj._SyncObj__onBecomeLeader(self)
        if self._rm_sync_flush:
            self._rm_journal.sync()  # the leader counts its own no-op: durable first

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if self._rm_blocked and node.id in self._rm_blocked:
            return  # fault injection: dropped as a firewall would
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == _PRE_VOTE:
            self._rm_on_pre_vote(node, message)
        elif kind == _PRE_VOTE_REPLY:
            self._rm_on_pre_vote_reply(node, message)
        elif kind == "append_entries" and "prevLogIdx" in message and "transmission" not in message:
            self._rm_on_append_entries(node, message)
        elif kind == _FETCH:
            self._rm_on_fetch(node, message)
        elif kind == _FETCH_REPLY:
            self._rm_on_fetch_reply(node, message)
        elif kind == "next_node_idx" and self._SyncObj__raftState == _LEADER:
            self._rm_peer_cannot_write[node.id] = bool(message.get(_CANNOT_WRITE, False))
            self._rm_on_next_node_idx(node, message)
        else:
            SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _SyncObj__sendAppendEntries(self) -> None:
        """Leader: stream each follower what it lacks from the journal, bounded per peer."""
        period = self._SyncObj__conf.appendEntriesPeriod
        now = raft_clock()
        self._SyncObj__newAppendEntriesTime = now + period
        j = self._rm_journal
        term = self._SyncObj__raftCurrentTerm
        commit = self._SyncObj__raftCommitIndex
        transport = self._SyncObj__transport
        connected = self._SyncObj__connectedNodes
        next_index = self._SyncObj__raftNextIndex
        for node in self._SyncObj__otherNodes | self._SyncObj__readonlyNodes:
            if node not in connected:
                continue
            conn = transport._connections.get(node)
            nxt = next_index[node]
            prev = nxt - 1
            if prev < j.first_index - 1 or (prev == j.first_index - 1 and not j.has_base):
                # Only a broker group's retention cut a log's head, and broker groups no longer
                # run here: a controller's follower cannot be behind it. Said once, not served.
                self._rm_warn_behind(node, nxt)
                continue
            heartbeat_due = True
            while True:
                if conn is not None and conn.getSendBufferSize() > self._rm_max_inflight:
                    break  # the follower is slow: what is queued already keeps its timer alive
                last = j.last_index
                if nxt > last and not heartbeat_due:
                    break
                try:
                    records = (
                        j.read_range(nxt, max_bytes=self._rm_send_bytes, max_count=_MAX_SEND_COUNT)
                        if nxt <= last
                        else []
                    )
                except CorruptJournalError as exc:
                    # This peer's replication only waits for the repair; the other peers and
                    # the tick go on (the journal told StorageHealth; this node hands off).
                    self._rm_unreadable_for_peer(node, exc)
                    records = []
                    if not heartbeat_due:
                        break
                transport.send(
                    node,
                    {
                        "type": "append_entries",
                        "term": term,
                        "commit_index": commit,
                        "entries": [(r.command, r.index, r.term) for r in records],
                        "prevLogIdx": nxt - 1,
                        "prevLogTerm": j.term_at(nxt - 1),
                    },
                )
                heartbeat_due = False
                if records:
                    nxt = records[-1].index + 1
                    next_index[node] = nxt
                if node not in connected or raft_clock() - now > period:
                    break

    def _rm_unreadable_for_peer(self, node: Any, exc: CorruptJournalError) -> None:
        key = (node.id, exc.index)
        if key in self._rm_unreadable_logged:
            return
        if len(self._rm_unreadable_logged) >= _MAX_UNREADABLE_LOGGED:
            self._rm_unreadable_logged.clear()  # bounded: at worst a line is repeated
        self._rm_unreadable_logged.add(key)
        log.error(
            "raft.replication_read_failed node=%s peer=%s index=%s path=%s offset=%d reason=%s "
            "action=heartbeats_only_for_this_peer",
            self._rm_cfg.node_id,
            node.id,
            exc.index,
            exc.path,
            exc.offset,
            exc.reason.replace(" ", "_"),
        )

    def _rm_warn_behind(self, node: Any, next_index: int) -> None:
        if node.id in self._rm_warned_gap:
            return
        self._rm_warned_gap.add(node.id)
        log.error(
            "raft.follower_behind_log_head peer=%s next_index=%d first_index=%d action=none",
            node.id,
            next_index,
            self._rm_journal.first_index,
        )

    # ---- our replication handlers ---------------------------------------------------------------

    def _rm_accept_leader(self, node: Any, msg: dict[str, Any]) -> bool:
        """The prologue of a message from a leader: False for a deposed leader's; otherwise
        this node follows `node` in the message's term."""
        term = msg["term"]
        if term < self._SyncObj__raftCurrentTerm:
            return False  # a deposed leader; it learns the new term from the new leader's traffic
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = (
                raft_clock() + self._SyncObj__generateRaftTimeout()
            )
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_FOLLOWER)
        # A live leader: this node answers pre-votes with no, and a round it won before this
        # message no longer entitles it to an election.
        self._rm_leader_contact = raft_clock()
        self._rm_round = None
        self._rm_election_allowed = False
        return True

    def _rm_on_append_entries(self, node: Any, msg: dict[str, Any]) -> None:
        """Follower side of AppendEntries as the Raft paper has it: truncate only on conflict."""
        if not self._rm_accept_leader(node, msg):
            return
        leader_commit = msg["commit_index"]
        self._SyncObj__leaderCommitIndex = leader_commit

        j = self._rm_journal
        health = self._rm_health
        now = time.monotonic()
        if not health.may_try("journal", now):
            # A full disk: take nothing until the back-off ends; the leader resends from here.
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=j.last_index + 1, reset=True)
            return
        try:
            decision = follower_append(
                j,
                self._SyncObj__raftCommitIndex,
                AppendRequest(
                    prev_index=msg["prevLogIdx"],
                    prev_term=msg["prevLogTerm"],
                    leader_commit=leader_commit,
                    entries=msg["entries"],
                ),
            )
        except CommittedEntryConflictError as exc:
            self._rm_on_fatal(self._rm_cfg.node_id, exc)
            return
        reply = decision.reply
        if not reply.success:
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=reply.next_index, reset=True)
            return
        try:
            if decision.truncate_from is not None:
                last = j.last_index
                j.truncate_suffix(decision.truncate_from)
                log.warning(
                    "raft.truncated_uncommitted node=%s from_index=%d to_index=%d count=%d",
                    self._rm_cfg.node_id,
                    decision.truncate_from,
                    last,
                    last - decision.truncate_from + 1,
                )
            for command, idx, entry_term in decision.append:
                j.append(idx, entry_term, command)
            if decision.append and self._rm_sync_flush:
                j.sync()  # SYNC_FLUSH: durable before this node counts toward the commit
        except OSError as exc:
            # What was appended stays (unacknowledged); the leader resends the rest after the
            # back-off. Durability: nothing is acknowledged that is not written.
            health.failed("journal", str(j.directory), exc, now)
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=j.last_index + 1, reset=True)
            return
        if decision.append:
            health.succeeded("journal", now)
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=reply.next_index, success=True)
        if decision.commit_index > self._SyncObj__raftCommitIndex:
            self._SyncObj__raftCommitIndex = decision.commit_index
            self._SyncObj__raftLog.setRaftCommitIndex(decision.commit_index)

    def _rm_on_next_node_idx(self, node: Any, msg: dict[str, Any]) -> None:
        """Leader side of the ack: nextIndex never rewinds on success (no re-sent ranges)."""
        next_index = self._SyncObj__raftNextIndex
        match_index = self._SyncObj__raftMatchIndex
        if node not in next_index:
            return
        before = Progress(match_index=match_index[node], next_index=next_index[node])
        after = leader_on_ack(
            before,
            Ack(next_index=msg["next_node_idx"], success=msg["success"], reset=msg["reset"]),
        )
        if after.match_index < before.match_index:
            # The follower lost entries it had acknowledged (restart after ASYNC_FLUSH).
            log.warning(
                "raft.peer_lost_acked_entries peer=%s match_index=%d peer_next=%d",
                node.id,
                before.match_index,
                after.next_index,
            )
        match_index[node] = after.match_index
        next_index[node] = after.next_index
        self._SyncObj__lastResponseTime[node] = raft_clock()


def _refuse_utility(args: Any, callback: Callable[[Any, int], None]) -> None:
    callback(None, FAIL_REASON.REQUEST_DENIED)
