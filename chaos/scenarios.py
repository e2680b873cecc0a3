"""The chaos scenarios: named, seeded fault schedules as plain data. No processes, no network:
the runner (chaos/runner.py) turns each FaultSpec into signals and nftables rules, resolving
role selectors such as "leader" against the live cluster when the fault starts."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


class Kind(enum.Enum):
    """What a fault does when it starts, and how it is healed when its window ends."""

    KILL = "kill"  # SIGKILL; heal: restart
    CRASH = "crash"  # isolate, then SIGKILL (peers see silence, not a FIN); heal: restart, rejoin
    PAUSE = "pause"  # SIGSTOP (connects still succeed); heal: SIGCONT
    ISOLATE = "isolate"  # cut from every other host, clients included; heal: rejoin
    SPLIT = "split"  # cut from the other nodes of its group only (clients still reach it)
    ONE_WAY_OUT = "one-way-out"  # packets from the target to the other group nodes dropped
    ONE_WAY_IN = "one-way-in"  # packets from the other group nodes to the target dropped
    CLIENT_CUT = "client-cut"  # the client host cannot reach the target
    DELAY = "delay"  # every packet the target sends is held `delay_ms` (+- jitter_ms)
    LOSS = "loss"  # `loss_pct` % of the target's packets dropped, both ways
    DISK_FULL = "disk-full"  # the target's data disk (a small tmpfs) filled; heal: freed
    # Storage faults (issue 25, chaos/storage_faults.py): one byte of the target's files changed
    # while it runs; nothing to heal (the node must find, report and repair it by itself).
    CORRUPT_SEGMENT = "corrupt-segment"  # a record in the middle of a sealed journal segment
    CORRUPT_ROW = "corrupt-row"  # a ConsumeQueue row's byte (malformed)
    FORGE_ROW = "forge-row"  # a ConsumeQueue row pointing at another batch (well-formed)


STORAGE_FAULTS = (Kind.CORRUPT_SEGMENT, Kind.CORRUPT_ROW, Kind.FORGE_ROW)


# Role selectors, resolved by the runner when the fault starts.
LEADER = "leader"  # the current Raft leader of the broker group under test
FOLLOWER = "follower"  # one follower of that group, picked with the scenario's seed
GROUP = "group"  # every node of that group


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault window: starts `start_s` after the workload does, healed `length_s` later.
    `majority_remains`: a majority of the group stays reachable by the client during the
    window, so service must come back within the failover bound before the heal."""

    kind: Kind
    target: str
    start_s: float
    length_s: float
    majority_remains: bool = True
    delay_ms: int = 0
    jitter_ms: int = 0
    loss_pct: int = 0

    @property
    def end_s(self) -> float:
        return self.start_s + self.length_s

    @property
    def name(self) -> str:
        return f"{self.kind.value}({self.target})"


@dataclass(frozen=True, slots=True)
class Schedule:
    """What one run does: produce for `produce_s`, with `faults` inside that time; every fault
    ends at least `recovery_s` before producing stops, so the history shows the recovery."""

    scenario: str
    seed: int
    produce_s: float
    faults: tuple[FaultSpec, ...]


WARMUP_S = 5.0
RECOVERY_S = 8.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    ci: bool  # in the CI set (`make chaos`); every scenario is in `make chaos-full`
    build: Callable[[random.Random, float], tuple[FaultSpec, ...]]
    default_duration_s: float = 30.0
    # The workload (chaos/workload.py `--mode`): "queue", or a lifecycle feature's
    # (chaos/lifecycle_workload.py), checked by chaos/lifecycle_checks.py as well.
    workload: str = "queue"
    # Cluster settings laid over the cluster description's, per section ("broker": {...}).
    settings: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # Start a raftmq-proxy (the RocketMQ 5 API) in the cluster, in its own namespace, when the
    # description has none: only the scenarios whose workload goes through it pay for it.
    proxy: bool = False
    # The group's leader and term must be the same at the end as before the first fault (a
    # fault that leaves the leader a majority must not cost it its leadership).
    leader_stays: bool = False
    # Security on (chaos/runner.py `secure_spec`): mutual TLS on every channel, certificates
    # made by the runner for the namespace IPs, auth with the run's admin; the workload
    # connects with the client certificate and signs as a user made for it.
    secure: bool = False

    def schedule(self, seed: int, duration_s: float | None = None) -> Schedule:
        produce_s = self.default_duration_s if duration_s is None else duration_s
        if produce_s < WARMUP_S + RECOVERY_S + 4:
            raise ValueError(
                f"scenario {self.name}: a duration of {produce_s:g} s leaves no time for a fault; "
                f"use at least {WARMUP_S + RECOVERY_S + 4:g} s"
            )
        faults = self.build(random.Random(seed), produce_s)
        for f in faults:
            if f.start_s < 0 or f.end_s > produce_s - RECOVERY_S + 1e-9:
                raise AssertionError(f"{self.name}: {f.name} outside the produce window")
        return Schedule(self.name, seed, produce_s, faults)


def _window(rng: random.Random, produce_s: float) -> tuple[float, float]:
    """One fault after the warm-up, ending RECOVERY_S before the end; the seed shifts the start
    by up to a second so runs with different seeds hit different moments of the send loop."""
    start = WARMUP_S + rng.uniform(0.0, 1.0)
    return start, max(2.0, produce_s - RECOVERY_S - start)


def _single(
    kind: Kind, target: str, *, majority: bool = True, **params: int
) -> Callable[[random.Random, float], tuple[FaultSpec, ...]]:
    def build(rng: random.Random, produce_s: float) -> tuple[FaultSpec, ...]:
        start, length = _window(rng, produce_s)
        return (FaultSpec(kind, target, start, length, majority, **params),)

    return build


def _none(rng: random.Random, produce_s: float) -> tuple[FaultSpec, ...]:
    return ()


def _two_halves(
    first: FaultSpec, second_kind: Kind, second_target: str, **params: int
) -> Callable[[random.Random, float], tuple[FaultSpec, ...]]:
    """Two faults one after the other in the fault window (with a 2 s gap between them)."""

    def build(rng: random.Random, produce_s: float) -> tuple[FaultSpec, ...]:
        start, length = _window(rng, produce_s)
        half = (length - 2.0) / 2
        a = FaultSpec(first.kind, first.target, start, half, first.majority_remains,
                      first.delay_ms, first.jitter_ms, first.loss_pct)  # fmt: skip
        b = FaultSpec(second_kind, second_target, start + half + 2.0, half, True, **params)
        return (a, b)

    return build


RANDOM_KINDS = (Kind.KILL, Kind.CRASH, Kind.PAUSE, Kind.ISOLATE, Kind.SPLIT, Kind.ONE_WAY_OUT)


def _random_mix(rng: random.Random, produce_s: float) -> tuple[FaultSpec, ...]:
    """Jepsen-style: faults on random targets, each 3-8 s, staggered 2-6 s apart, until the
    recovery time; one fault at a time, so every window has one cause."""
    out: list[FaultSpec] = []
    t = WARMUP_S
    end = produce_s - RECOVERY_S
    while True:
        t += rng.uniform(2.0, 6.0)
        length = rng.uniform(3.0, 8.0)
        if t + length > end:
            break
        kind = rng.choice(RANDOM_KINDS)
        target = rng.choice((LEADER, LEADER, FOLLOWER))
        out.append(FaultSpec(kind, target, t, length))
        t += length
    return tuple(out)


# Storage fault scenarios: 1 MiB journal segments, so that filler sends seal one in seconds.
STORAGE_SETTINGS = {"broker": {"segment_bytes": 1 << 20}}

# Lifecycle scenarios' cluster settings: check-backs and retries scaled down so that many of
# them happen inside one ~17 s fault window.
TXN_SETTINGS = {"broker": {"transaction_timeout_ms": 2_000, "transaction_check_interval_ms": 1_000}}
RETRY_DELAY_LEVELS = "100ms 200ms 500ms 1s 1500ms 2s 3s 4s 5s 6s 7s 8s 9s 10s 20s 30s 1m 2m"
RETRY_SETTINGS = {"broker": {"delay_levels": RETRY_DELAY_LEVELS}}
# Acknowledged progress committed to the group often, so the drain's re-reads stay few.
PROXY_SETTINGS = {"proxy": {"offset_commit_interval_ms": 200}}

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("baseline", "no fault: the checkers' sanity run", False, _none),
    Scenario("leader-kill", "SIGKILL the group leader, restart it at the heal", True,
             _single(Kind.KILL, LEADER)),
    Scenario("leader-crash", "isolate the leader, then SIGKILL it (no FIN to its peers)", True,
             _single(Kind.CRASH, LEADER)),
    Scenario("leader-isolate", "cut the leader off from every host, clients included", True,
             _single(Kind.ISOLATE, LEADER)),
    Scenario("minority-partition",
             "split the group: the leader alone, its followers together (clients reach both)",
             True, _single(Kind.SPLIT, LEADER)),
    Scenario("leader-one-way", "drop every packet from the leader to its followers", True,
             _single(Kind.ONE_WAY_OUT, LEADER)),
    Scenario("leader-pause", "SIGSTOP the leader, SIGCONT at the heal (a stale leader wakes)",
             True, _single(Kind.PAUSE, LEADER)),
    Scenario("follower-kill", "SIGKILL one follower: no failover, no gap", False,
             _single(Kind.KILL, FOLLOWER)),
    Scenario("follower-isolate",
             "cut one follower off from every host for many election timeouts, then rejoin: "
             "PreVote keeps it from deposing the leader (same leader, same term at the end)",
             False, _single(Kind.ISOLATE, FOLLOWER), leader_stays=True),
    Scenario("leader-one-way-in", "drop every packet from the followers to the leader", False,
             _single(Kind.ONE_WAY_IN, LEADER)),
    Scenario("client-cut",
             "the client cannot reach the leader (the group is healthy): sends wait for the heal",
             False, _single(Kind.CLIENT_CUT, LEADER, majority=False)),
    Scenario("control-plane-down",
             "SIGKILL the NameServer, then the controller: the data path keeps its routes",
             False, _two_halves(FaultSpec(Kind.KILL, "namesrv-0", 0, 0), Kind.KILL,
                                "controller-0")),
    Scenario("slow-lossy", "the leader's packets delayed 200+-50 ms, then 25% loss on a follower",
             False, _two_halves(FaultSpec(Kind.DELAY, LEADER, 0, 0, True, 200, 50), Kind.LOSS,
                                FOLLOWER, loss_pct=25)),
    Scenario("group-restart", "SIGKILL all three nodes of the group; restart them at the heal",
             False, _single(Kind.KILL, GROUP, majority=False)),
    Scenario("leader-disk-full",
             "fill the leader's data disk (each group node on a 64 MiB tmpfs), free it at the heal:"
             " it hands leadership to a follower that can write and catches up afterwards",
             False, _single(Kind.DISK_FULL, LEADER)),
    Scenario("follower-disk-full", "fill one follower's data disk: no failover, no gap", False,
             _single(Kind.DISK_FULL, FOLLOWER)),
    Scenario("txn-leader-kill",
             "transactions (commit, rollback, unknown then check-back) while the leader is "
             "SIGKILLed: check-backs come from the new leader; none half delivered, none lost",
             False, _single(Kind.KILL, LEADER), workload="txn", settings=TXN_SETTINGS),
    Scenario("delay-leader-kill",
             "messages delayed 0.5-8 s fall due while the leader is SIGKILLed: each delivered "
             "once, none early, none lost", False, _single(Kind.KILL, LEADER), workload="delay"),
    Scenario("retry-leader-kill",
             "a push consumer fails every message twice (send-backs, retries at a scaled back-off)"
             " while the leader is SIGKILLed: each consumed in the end, no retry early",
             False, _single(Kind.KILL, LEADER), workload="retry", settings=RETRY_SETTINGS),
    Scenario("orderly-leader-kill",
             "keyed sends to an orderly push consumer while the leader is SIGKILLed: order per "
             "key, one message per queue in the listener at a time", False,
             _single(Kind.KILL, LEADER), workload="orderly"),
    Scenario("proxy-leader-kill",
             "the official RocketMQ 5 Python client sends and a SimpleConsumer receives through "
             "a raftmq-proxy while the leader is SIGKILLed: the client goes on, none lost",
             False, _single(Kind.KILL, LEADER), workload="proxy", settings=PROXY_SETTINGS,
             proxy=True),
    Scenario("secure-leader-kill",
             "leader-kill with security on: mutual TLS on every channel (certificates for the "
             "namespace IPs) and auth (the workload signs as a user allowed its topic and group "
             "only); plaintext, certificate-less and unsigned calls refused",
             False, _single(Kind.KILL, LEADER), secure=True),
    Scenario("leader-corrupt-segment",
             "flip a byte of a record in the middle of a sealed journal segment of the leader "
             "under load: reported within seconds, repaired from a peer, never served",
             False, _single(Kind.CORRUPT_SEGMENT, LEADER), settings=STORAGE_SETTINGS),
    Scenario("follower-corrupt-segment",
             "the same on a follower: its scrubber finds it, a peer's copy repairs it",
             False, _single(Kind.CORRUPT_SEGMENT, FOLLOWER), settings=STORAGE_SETTINGS),
    Scenario("leader-corrupt-row",
             "flip a byte of a ConsumeQueue row in the leader's index store under load: the "
             "index scrub finds it, the leader hands off and rebuilds its index from the log",
             False, _single(Kind.CORRUPT_ROW, LEADER), settings=STORAGE_SETTINGS),
    Scenario("follower-corrupt-row", "the same on a follower: no failover, rebuilt in place",
             False, _single(Kind.CORRUPT_ROW, FOLLOWER), settings=STORAGE_SETTINGS),
    Scenario("leader-forged-row",
             "rewrite a ConsumeQueue row of the leader to point at another batch of its queue "
             "(well-formed: the issue's silent wrong data): caught by its checksum, never served",
             False, _single(Kind.FORGE_ROW, LEADER), settings=STORAGE_SETTINGS),
    Scenario("follower-forged-row", "the same on a follower", False,
             _single(Kind.FORGE_ROW, FOLLOWER), settings=STORAGE_SETTINGS),
    Scenario("random-mix", "seeded random kills, crashes, pauses and partitions (Jepsen-style)",
             False, _random_mix, default_duration_s=90.0),
)  # fmt: skip


def by_name(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(
        f"no chaos scenario {name!r}; `raftmq chaos list` shows them: "
        + ", ".join(s.name for s in SCENARIOS)
    )


def ci_set() -> list[Scenario]:
    return [s for s in SCENARIOS if s.ci]
