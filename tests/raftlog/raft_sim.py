"""A deterministic simulator of a Raft group: N RaftCores, a seeded network that drops, duplicates,
delays, reorders and partitions (both ways or one way), crashes that keep only what was durable
(a torn tail included), a clock the test drives and a client; Raft's safety checked at every step.

Everything random comes from the seed, so a failure replays exactly; the failure message names
the seed and the schedule. No threads, sockets or wall-clock reads.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raftmq.raftlog.election import LogPosition
from raftmq.raftlog.errors import CommittedEntryConflictError, NotLeaderError
from raftmq.raftlog.raft_core import RaftConfig, RaftCore, Role, TransferRefusedError
from raftmq.raftlog.raft_messages import (
    AppendResponse,
    Entry,
    HardState,
    Message,
    PreVote,
    PreVoteResponse,
    Ready,
    RequestVote,
    VoteResponse,
)
from raftmq.raftlog.snapshot import Snapshot

Event = tuple[Any, ...]  # ("tick", 2), ("crash", "n1"), ("partition", ("n1",)), ...
CoreFactory = Callable[..., RaftCore]


class Violation(AssertionError):
    """A broken invariant; `kind` names which (election_safety, log_matching, ...)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


SAFETY_KINDS = frozenset(
    {
        "election_safety",
        "log_matching",
        "leader_completeness",
        "state_machine_safety",
        "acknowledged_lost",
        "committed_entry_conflict",
    }
)


@dataclass(frozen=True, slots=True)
class SimSettings:
    nodes: int = 3
    events: int = 60
    drop: float = 0.08
    duplicate: float = 0.04
    max_delay_ticks: int = 3
    crash_weight: int = 4  # relative weights of fault events against ~60 for ticks
    compact_weight: int = 2
    isolate_weight: int = 2
    transfer_weight: int = 2
    liveness_ticks: int = 150  # after healing: a leader and a commit within this many ticks
    election_ticks: int = 8
    heartbeat_ticks: int = 2
    max_inflight: int = 3
    slow_write: float = 0.3  # share of Readies whose write takes 1-2 ticks
    isolate_new_leader: float = 0.3  # chance a new leader is cut off at once, for 10-40 ticks


@dataclass(slots=True)
class Disk:
    """What survives a crash: hard state, snapshot, and the entries after the snapshot."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)

    @property
    def base(self) -> int:
        return self.snapshot.base_index if self.snapshot else 0

    @property
    def last_index(self) -> int:
        return self.base + len(self.entries)

    def term_at(self, index: int) -> int | None:
        if index == self.base:
            return self.snapshot.base_term if self.snapshot else 0
        if self.base < index <= self.last_index:
            return self.entries[index - self.base - 1].term
        return None

    @property
    def last_position(self) -> LogPosition:
        term = self.term_at(self.last_index)
        assert term is not None
        return LogPosition(term, self.last_index)

    def holds(self, e: Entry) -> bool:
        if e.index <= self.base:
            return True  # inside the snapshot (state-machine safety checks its content)
        return e.index <= self.last_index and self.entries[e.index - self.base - 1] == e

    # The core reads its stable entries through these two (raft_core.LogStorage).
    def term(self, index: int) -> int:
        if not self.base < index <= self.last_index:
            raise IndexError(index)
        return self.entries[index - self.base - 1].term

    def slice(self, lo: int, hi: int) -> list[Entry]:
        if not self.base < lo <= hi <= self.last_index + 1:
            raise IndexError((lo, hi))
        return self.entries[lo - self.base - 1 : hi - self.base - 1]

    def write(self, entries: tuple[Entry, ...]) -> None:
        """Overwrite from entries[0].index (the Ready contract)."""
        start = entries[0].index
        del self.entries[start - self.base - 1 :]
        self.entries.extend(entries)


@dataclass(slots=True)
class SimNode:
    id: str
    disk: Disk = field(default_factory=Disk)
    core: RaftCore | None = None
    applied: list[bytes] = field(default_factory=list)  # the state machine: payload of index i+1
    eligible: bool = True
    writing: Ready | None = None  # a Ready whose write is under way
    write_done_at: int = 0
    armed: str | None = None  # crash_torn / crash_meta: crash while persisting a coming Ready


def encode_state(applied: list[bytes]) -> bytes:
    return json.dumps([d.hex() for d in applied]).encode()


def decode_state(data: bytes) -> list[bytes]:
    return [bytes.fromhex(h) for h in json.loads(data)]


def make_schedule(seed: int, s: SimSettings) -> list[Event]:
    """The seed's list of events; the network's own randomness comes from the same seed."""
    rng = random.Random(seed)
    ids = [f"n{k + 1}" for k in range(s.nodes)]
    kinds: list[tuple[str, int]] = [
        ("tick", 60),
        ("propose", 14),
        ("crash", s.crash_weight),
        ("crash_leader", s.crash_weight),
        ("crash_torn", s.crash_weight),
        ("crash_meta", s.crash_weight),
        ("restart", 2 * s.crash_weight),
        ("partition", 3),
        ("isolate_leader", s.isolate_weight),
        ("oneway", 3),
        ("disconnect", 2),
        ("heal", 2 + s.isolate_weight),
        ("compact", s.compact_weight),
        ("transfer", s.transfer_weight),
        ("ineligible", 1),
        ("eligible", 2),
    ]
    names = [k for k, _ in kinds]
    weights = [w for _, w in kinds]
    events: list[Event] = []
    for _ in range(s.events):
        kind = rng.choices(names, weights)[0]
        node = rng.choice(ids)
        if kind == "tick":
            events.append(("tick", rng.randint(1, 3)))
        elif kind == "propose":
            events.append(("propose", rng.randint(1, 3)))
        elif kind == "partition":
            side = tuple(sorted(rng.sample(ids, rng.randint(1, s.nodes // 2))))
            events.append(("partition", side))
        elif kind in ("oneway", "disconnect"):
            a, b = rng.sample(ids, 2)
            events.append((kind, a, b))
        elif kind in ("heal", "crash_leader", "isolate_leader"):
            events.append((kind,))
        elif kind == "transfer":
            events.append(("transfer", rng.choice([None, *ids])))
        else:
            events.append((kind, node))
    return events


class Simulation:
    """One schedule run. `core_factory` builds the cores (tests pass a subclass with a rule
    removed); `send_early` names messages a buggy shell sends before persisting the Ready."""

    def __init__(
        self,
        seed: int,
        settings: SimSettings | None = None,
        core_factory: CoreFactory = RaftCore,
        *,
        send_early: Callable[[Message], bool] | None = None,
        check_contract: bool = True,
        schedule: list[Event] | None = None,
    ) -> None:
        self.seed = seed
        self.s = settings = settings or SimSettings()
        self.schedule = make_schedule(seed, settings) if schedule is None else schedule
        self.core_factory = core_factory
        self.send_early = send_early
        self.check_contract = check_contract
        self.rng = random.Random(seed * 7919 + 1)  # network, torn tails, client choices
        self.config = RaftConfig(
            election_ticks=settings.election_ticks,
            heartbeat_ticks=settings.heartbeat_ticks,
            max_inflight=settings.max_inflight,
            max_entries_per_append=1 + seed % 3,  # 1 makes old-term entries travel alone
        )
        self.ids = [f"n{k + 1}" for k in range(settings.nodes)]
        self.quorum = settings.nodes // 2 + 1
        self.nodes = {i: SimNode(i) for i in self.ids}
        self.now = 0
        self.drop = settings.drop
        self.duplicate = settings.duplicate
        self._heap: list[tuple[int, int, Message]] = []
        self._seq = 0
        self.blocked: set[tuple[str, str]] = set()
        # What the invariants remember.
        self.leaders: dict[int, str] = {}  # term -> the one leader of it
        self.entry_ids: dict[
            tuple[int, int], tuple[bytes, int]
        ] = {}  # (index, term) -> data, prev term
        self.committed: dict[int, Entry] = {}  # index -> the entry applied there
        self.pending: dict[
            tuple[str, int], tuple[int, bytes]
        ] = {}  # (node, index) -> term, payload
        self.acked: list[Entry] = []
        self._max_acked = 0
        self._recheck_acked = False
        self._proposal_seq = 0
        self.step_no = -1
        self._healed = False
        self._cut_off: dict[str, int] = {}  # node -> tick its cut-off link comes back
        self.stats: Counter[str] = Counter()
        self._new_leaders_checked: set[tuple[str, int]] = set()
        for n in self.nodes.values():
            self._start(n)

    # ---- running ------------------------------------------------------------------------

    def run(self) -> None:
        """Play the schedule, then heal everything and require a leader and a commit."""
        try:
            for step_no, ev in enumerate(self.schedule):
                self.step_no = step_no
                self._do(ev)
                self._check_after_step()
            self.step_no = len(self.schedule)
            self._liveness()
        except Violation as v:
            raise Violation(v.kind, f"{v.detail}\n{self.describe()}") from None
        except CommittedEntryConflictError as e:
            raise Violation("committed_entry_conflict", f"{e}\n{self.describe()}") from None

    def describe(self) -> str:
        return (
            f"seed={self.seed} settings={self.s} failed at event {self.step_no} (tick {self.now})\n"
            f"replay: RAFT_SIM_SEED={self.seed} .venv/bin/pytest tests/raftlog/test_raft_sim.py "
            f"(or Simulation({self.seed}, {self.s}).run() with the same core and shell)\n"
            f"schedule: {self.schedule}"
        )

    def _do(self, ev: Event) -> None:
        kind = ev[0]
        if kind == "tick":
            for _ in range(ev[1]):
                self.tick()
        elif kind == "propose":
            self.propose(ev[1])
        elif kind == "crash":
            self.crash(ev[1])
        elif kind == "crash_leader":
            for leader in self._leaders():
                self.crash(leader.id)
        elif kind in ("crash_torn", "crash_meta"):
            n = self.nodes[ev[1]]
            if n.core is not None:
                n.armed = kind
        elif kind == "isolate_leader":
            for leader in self._leaders():
                self._do(("partition", (leader.id,)))
        elif kind == "restart":
            n = self.nodes[str(ev[1])]
            if n.core is None:
                self._start(n)
        elif kind == "partition":
            side = set(ev[1])
            self.blocked = {
                (a, b) for a in self.ids for b in self.ids if (a in side) != (b in side)
            }
        elif kind == "oneway":
            self.blocked.add((str(ev[1]), str(ev[2])))
        elif kind == "disconnect":
            # A connection from ev[1] reset while both live (the shell's notice of it).
            n = self.nodes[str(ev[2])]
            if n.core is not None:
                n.core.peer_disconnected(str(ev[1]))
                self._drain(n)
        elif kind == "heal":
            self.blocked.clear()
        elif kind == "compact":
            self.compact(str(ev[1]))
        elif kind == "transfer":
            self.transfer(None if ev[1] is None else str(ev[1]))
        elif kind in ("ineligible", "eligible"):
            n = self.nodes[str(ev[1])]
            n.eligible = kind == "eligible"
            if n.core is not None:
                n.core.set_eligible(n.eligible)
                self._drain(n)
        else:
            raise ValueError(f"unknown event {ev}")

    def tick(self) -> None:
        self.now += 1
        for n in self.nodes.values():
            if n.core is not None:
                n.core.tick()
                self._drain(n)
        while self._heap and self._heap[0][0] <= self.now:
            _, _, m = heapq.heappop(self._heap)
            target = self.nodes[m.to]
            if target.core is None or (m.sender, m.to) in self.blocked:
                continue
            if self._cut_off and (
                self._cut_off.get(m.sender, 0) > self.now or self._cut_off.get(m.to, 0) > self.now
            ):
                continue
            target.core.step(m)
            self._drain(target)
        for n in self.nodes.values():
            if n.writing is not None and n.write_done_at <= self.now:
                rd, n.writing = n.writing, None
                self._finish(n, rd)
                self._drain(n)

    def propose(self, count: int, prefix: str = "v") -> None:
        leaders = [
            n
            for n in self.nodes.values()
            if n.core is not None and n.core.role is Role.LEADER and n.core.transfer_target is None
        ]
        if not leaders:
            return
        n = self.rng.choice(leaders)
        assert n.core is not None
        payloads = []
        for _ in range(count):
            self._proposal_seq += 1
            payloads.append(f"{prefix}{self._proposal_seq}".encode())
        first, term = n.core.propose(payloads)
        for k, p in enumerate(payloads):
            self.pending[(n.id, first + k)] = (term, p)
        self._drain(n)

    def crash(self, node: str) -> None:
        """Kill the node: it keeps what it was told is durable, and of a write under way
        a prefix (a torn tail)."""
        n = self.nodes[node]
        if n.writing is not None:
            self._persist(n, n.writing, torn=True)
            n.writing = None
            self.stats["crash_in_write"] += 1
        n.core = None
        n.applied = []
        n.armed = None
        # The dead process's connections close: the peers it can reach are told, as a shell is.
        for other in self.nodes.values():
            if other.core is not None and (node, other.id) not in self.blocked:
                other.core.peer_disconnected(node)
                self._drain(other)

    def _leaders(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.core is not None and n.core.role is Role.LEADER]

    def _torn_crash(self, n: SimNode, rd: Ready) -> None:
        """Power lost while persisting `rd`: a prefix of its entries may be kept, its hard state
        only if all of them were; of its messages only the leader's appends have left (and
        what a buggy shell sends early). The supervisor restarts the node at once."""
        self._persist(n, rd, torn=True)
        self.stats[n.armed or "torn"] += 1
        self.crash(n.id)
        self._start(n)

    def compact(self, node: str) -> None:
        n = self.nodes[node]
        core = n.core
        if core is None or n.writing is not None:
            return
        top = min(core.applied, core.durable_index)
        up_to = max(core.log.base_index, top - self.rng.randrange(3))
        snap = core.compact(up_to, encode_state(n.applied[:up_to]))
        self.stats["compactions"] += 1
        del n.disk.entries[: up_to - n.disk.base]
        n.disk.snapshot = snap

    def transfer(self, target: str | None) -> None:
        for n in self.nodes.values():
            if n.core is not None and n.core.role is Role.LEADER:
                # Refused is an answer too: the schedule asked at a bad moment.
                with contextlib.suppress(TransferRefusedError, NotLeaderError):
                    n.core.transfer_leadership(None if target == n.id else target)
                self._drain(n)

    def _start(self, n: SimNode) -> None:
        d = n.disk
        n.core = self.core_factory(
            n.id,
            self.ids,
            self.config,
            seed=self.rng.randrange(1 << 32),
            hard_state=d.hard_state,
            snapshot=d.snapshot,
            storage=d,
        )
        n.core.set_eligible(n.eligible)
        n.applied = decode_state(d.snapshot.state) if d.snapshot else []
        self._drain(n)

    # ---- the shell: persist, send, apply (the Ready contract) ---------------------------

    def _drain(self, n: SimNode) -> None:
        core = n.core
        assert core is not None
        self._observe(n)
        while n.writing is None and core.has_ready():
            rd = core.ready()
            self._send_all(n, rd, early_only=True)
            if n.armed is not None and self._hits(n.armed, rd, core):
                self._torn_crash(n, rd)
                return
            if self.rng.random() < self.s.slow_write:
                # The write (its fdatasync) takes a tick or two; the node goes on stepping.
                n.writing = rd
                n.write_done_at = self.now + 1 + self.rng.randrange(2)
                return
            self._finish(n, rd)

    def _finish(self, n: SimNode, rd: Ready) -> None:
        assert n.core is not None
        self._persist(n, rd, torn=False)
        self._send_all(n, rd, early_only=False)
        self._apply(n, rd.committed)
        n.core.advance(rd)
        self._observe(n)

    def _persist(self, n: SimNode, rd: Ready, *, torn: bool) -> None:
        d = n.disk
        if rd.snapshot is not None:
            if torn and self.rng.random() < 0.5:
                return
            d.snapshot = rd.snapshot
            self.stats["snapshots_installed"] += 1
            d.entries.clear()
            self._recheck_acked = True
            if not torn:
                n.applied = decode_state(rd.snapshot.state)
                self._check_state(n, 0)
        if rd.entries:
            keep = len(rd.entries)
            if torn:
                keep = self.rng.randint(0, len(rd.entries))
            if keep:
                self._check_matching(d, rd.entries[:keep])
                if rd.entries[0].index <= d.last_index:
                    self._recheck_acked = True
                d.write(rd.entries[:keep])
            if keep < len(rd.entries):
                return
        if rd.hard_state is not None and not (torn and self.rng.random() < 0.5):
            d.hard_state = rd.hard_state

    @staticmethod
    def _hits(armed: str, rd: Ready, core: RaftCore) -> bool:
        """Whether an armed crash strikes this Ready: crash_torn while entries are written,
        crash_meta while a new term or vote is."""
        if armed == "crash_torn":
            return bool(rd.entries)
        hs = rd.hard_state
        return hs is not None and (hs.term, hs.vote) != (
            core.durable_hard_state.term,
            core.durable_hard_state.vote,
        )

    def _send_all(self, n: SimNode, rd: Ready, *, early_only: bool) -> None:
        """early_only: the leader's messages (they may leave before the write) and any a buggy
        shell sends early; else the rest, after the write."""
        early = self.send_early
        if early_only:
            out = list(rd.leader_messages)
            if early is not None:
                out += [m for m in rd.messages if early(m)]
        else:
            out = [m for m in rd.messages if early is None or not early(m)]
        for m in out:
            if self.check_contract:
                self._check_promise(n.disk, m)
            if isinstance(m, RequestVote) and m.transfer:
                self.stats["transfer_campaigns"] += 1
            if self.rng.random() < self.drop:
                continue
            copies = 2 if self.rng.random() < self.duplicate else 1
            for _ in range(copies):
                self._seq += 1
                due = self.now + 1 + self.rng.randrange(self.s.max_delay_ticks)
                heapq.heappush(self._heap, (due, self._seq, m))

    def _apply(self, n: SimNode, committed: tuple[Entry, ...]) -> None:
        for e in committed:
            if e.index != len(n.applied) + 1:
                raise Violation(
                    "state_machine_safety",
                    f"{n.id} applies index {e.index} after {len(n.applied)} (a gap or a repeat)",
                )
            known = self.committed.setdefault(e.index, e)
            if known is e:
                self._check_electable(e)
            if known != e:
                raise Violation(
                    "state_machine_safety",
                    f"{n.id} applies {e} at index {e.index}, another node applied {known}",
                )
            n.applied.append(e.data)
            want = self.pending.pop((n.id, e.index), None)
            if want is not None and want == (e.term, e.data):
                self._acknowledge(e)

    def _acknowledge(self, e: Entry) -> None:
        """The client heard "committed": from now on it must be on a majority, unchanged."""
        self.acked.append(e)
        self.stats["acknowledged"] += 1
        self._max_acked = max(self._max_acked, e.index)
        self._check_acked(e)

    # ---- invariants ---------------------------------------------------------------------

    def _observe(self, n: SimNode) -> None:
        """After every input to a core: election safety, leader completeness, eligibility."""
        core = n.core
        assert core is not None
        if core.role is Role.LEADER:
            first = self.leaders.setdefault(core.term, n.id)
            if first != n.id:
                raise Violation("election_safety", f"{first} and {n.id} both lead term {core.term}")
            if (n.id, core.term) not in self._new_leaders_checked:
                self._new_leaders_checked.add((n.id, core.term))
                self._check_completeness(n)
                if not self._healed and self.rng.random() < self.s.isolate_new_leader:
                    # A flapping link cuts a fresh leader off before its no-op gets anywhere,
                    # for a while that heals do not end (whoever it cut off before is back).
                    self._cut_off = {n.id: self.now + self.rng.randint(10, 40)}
                    self.stats["isolated_new_leader"] += 1
        elif not n.eligible and core.role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            raise Violation("eligibility", f"{n.id} campaigns while not eligible")

    def _check_completeness(self, n: SimNode) -> None:
        core = n.core
        assert core is not None
        for index, e in self.committed.items():
            if index <= core.log.base_index:
                continue
            if index > core.log.last_index or core.log.entries(index, index + 1)[0] != e:
                raise Violation(
                    "leader_completeness",
                    f"{n.id} leads term {core.term} without committed entry {e}",
                )

    def _check_electable(self, e: Entry) -> None:
        """Leader completeness, looked at one step ahead: the moment an entry is committed, no
        node lacking it (durably) may have a log at least as up-to-date as a majority's, for it
        could then be elected without it. Correct Raft keeps this (a committed index carries an
        entry of the committing leader's term on a majority); committing an older term's entry
        by counting replicas breaks it before any second election happens."""
        self.stats["committed"] += 1
        positions = {n.id: n.disk.last_position for n in self.nodes.values()}
        for n in self.nodes.values():
            if n.disk.holds(e):
                continue
            mine = positions[n.id]
            voters = [v for v, pos in positions.items() if mine >= pos]
            if len(voters) >= self.quorum:
                raise Violation(
                    "leader_completeness",
                    f"{e} is committed, yet {n.id} (log end {mine}) lacks it and could be "
                    f"elected by {voters}",
                )

    def _check_matching(self, d: Disk, entries: tuple[Entry, ...]) -> None:
        """Log matching, incrementally: an (index, term) always carries the same payload and
        follows the same term, so two logs sharing an entry share everything before it."""
        prev_term = d.term_at(entries[0].index - 1)
        for e in entries:
            if prev_term is None:
                raise Violation("log_matching", f"entry {e} written after a gap")
            seen = self.entry_ids.setdefault((e.index, e.term), (e.data, prev_term))
            if seen != (e.data, prev_term):
                raise Violation(
                    "log_matching",
                    f"(index {e.index}, term {e.term}) holds {seen} on one log, "
                    f"{(e.data, prev_term)} on another",
                )
            prev_term = e.term

    def _check_state(self, n: SimNode, start: int) -> None:
        for k in range(start, len(n.applied)):
            known = self.committed.get(k + 1)
            if known is not None and known.data != n.applied[k]:
                raise Violation(
                    "state_machine_safety",
                    f"{n.id}'s snapshot holds {n.applied[k]!r} at {k + 1}, applied was {known}",
                )

    def _check_acked(self, e: Entry) -> None:
        holders = [n.id for n in self.nodes.values() if n.disk.holds(e)]
        if len(holders) < self.quorum:
            raise Violation(
                "acknowledged_lost",
                f"acknowledged {e} is durable only on {holders} (needs {self.quorum})",
            )

    def _check_promise(self, d: Disk, m: Message) -> None:
        """The Ready contract: nothing leaves promising what is not durable yet."""
        if isinstance(m, PreVote | PreVoteResponse):
            return
        hs = d.hard_state
        if hs.term > m.term:
            return  # the node moved on: what it promised in m.term can no longer change
        broken = m.term > hs.term
        if isinstance(m, RequestVote):
            broken = broken or hs.vote != m.sender
        elif isinstance(m, VoteResponse) and m.granted:
            broken = broken or hs.vote != m.to
        elif isinstance(m, AppendResponse) and m.success:
            broken = broken or d.last_index < m.next_index - 1
        if broken:
            raise Violation("contract", f"{m} sent before {hs} / log end {d.last_index} durable")

    def _check_after_step(self) -> None:
        if self._recheck_acked:
            self._recheck_acked = False
            for e in self.acked:
                if e.index <= self._max_acked:
                    self._check_acked(e)

    # ---- liveness -----------------------------------------------------------------------

    def _liveness(self) -> None:
        """Heal everything; within the bound a leader must commit a new proposal."""
        self._healed = True
        self.blocked.clear()
        self._cut_off.clear()
        self.drop = self.duplicate = 0.0
        for n in self.nodes.values():
            n.eligible = True
            if n.core is None:
                self._start(n)
            else:
                n.core.set_eligible(True)
        before = len(self.acked)
        for t in range(self.s.liveness_ticks):
            self.tick()
            self._check_after_step()
            if any(e.data.startswith(b"live") for e in self.acked[before:]):
                self.stats["liveness_ticks"] = t + 1
                return
            if t % 4 == 0:  # a proposal lost with a leader change is asked again
                self.propose(1, prefix="live")
        leaders = {n.id: n.core.role.value for n in self.nodes.values() if n.core}
        raise Violation(
            "liveness",
            f"no proposal committed {self.s.liveness_ticks} ticks after healing; roles {leaders}",
        )


def find_violation(
    seeds: range, settings: SimSettings | None = None, **kwargs: Any
) -> tuple[int, Violation] | None:
    """The first seed whose run breaks an invariant, with the violation; None if all pass."""
    for seed in seeds:
        try:
            Simulation(seed, settings, **kwargs).run()
        except Violation as v:
            return seed, v
    return None
