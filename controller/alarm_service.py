"""Alarms, the shell: on the controller leader only (one elected component, not every node),
every `alarm_interval_ms` it measures what the rules need, feeds controller/alarms.py's book,
logs each firing and resolved event and POSTs it as JSON to `alarm_webhook_url`.

Measured: no_leader from the controller's own record and the brokers' role reports (the leader
it records has not reported within `balance_alive_ms`, or there is none); the rest from one
GetBrokerStatus(include_lags) per broker node (1 s deadline, in parallel): each node's disk use,
each follower's distance to its leader's commit index, each (group, topic)'s lag, each group's
DLQ size and what the next retention cut deletes unconsumed, on the leaders. A kind whose inputs
are incomplete this round (a leader did not answer) is not measured, so its alarms neither fire
nor resolve on partial data.

Each firing and resolution goes through the controller's Raft log before it is logged and
posted: a new controller leader starts from the replicated firing alarms (no second firing of
one still true; it posts the resolution). Pending states and the liveness table are soft: for
`balance_alive_ms` a new leader does not judge no_leader (the table fills from the next reports).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc

from raftmq.common import tls
from raftmq.common.auth import call_metadata
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.controller.alarms import Active, AlarmBook, Event, Kind, parse_rules
from raftmq.controller.liveness import Seen
from raftmq.controller.state import AlarmChange, GroupRecord

if TYPE_CHECKING:
    from raftmq.controller.node import ControllerNode

log = logging.getLogger("controller.alarms")

STATUS_TIMEOUT_S = 1.0
WEBHOOK_QUEUE = 1_000  # events waiting to be posted; past it the oldest waiting is dropped
WEBHOOK_TIMEOUT_S = 3.0
WEBHOOK_ATTEMPTS = 3
DLQ_PREFIX = "%DLQ%"
BROKER_KINDS = frozenset(
    {
        Kind.GROUP_LAG,
        Kind.DLQ_GROWTH,
        Kind.DISK_USED,
        Kind.FOLLOWER_BEHIND,
        Kind.STORAGE_ERROR,
        Kind.RETENTION_LOSS,
    }
)


def event_json(e: Event, controller: str) -> dict[str, object]:
    return {
        "seq": e.seq,
        "key": e.key,
        "status": e.status,
        "rule": e.rule,
        "subject": e.subject,
        "value": e.value,
        "at_ms": e.at_ms,
        "since_ms": e.since_ms,
        "controller": controller,
    }


class Webhook:
    """One thread posting events in order; each event is posted once, retried only when the
    receiver could not be reached or answered 5xx (a receiver deduplicates by `key`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._q: queue.Queue[dict[str, object] | None] = queue.Queue(WEBHOOK_QUEUE)
        self._thread = threading.Thread(target=self._run, name="alarm-webhook", daemon=True)
        self._thread.start()

    def post(self, doc: dict[str, object]) -> None:
        while True:
            try:
                self._q.put_nowait(doc)
                return
            except queue.Full:
                try:
                    dropped = self._q.get_nowait()
                    log.warning("controller.alarm_webhook_dropped event=%s", dropped)
                except queue.Empty:
                    pass

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(None)
        self._thread.join(timeout=WEBHOOK_TIMEOUT_S * WEBHOOK_ATTEMPTS + 1)

    def _run(self) -> None:
        while (doc := self._q.get()) is not None:
            body = json.dumps(doc).encode()
            for attempt in range(WEBHOOK_ATTEMPTS):
                req = urllib.request.Request(
                    self.url, data=body, headers={"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT_S) as resp:
                        resp.read()
                    break
                except urllib.error.HTTPError as exc:
                    if exc.code < 500:
                        log.warning("controller.alarm_webhook_refused code=%d", exc.code)
                        break
                    err: Exception = exc
                except (urllib.error.URLError, OSError) as exc:
                    err = exc
                log.warning("controller.alarm_webhook_failed attempt=%d error=%s", attempt + 1, err)
                time.sleep(0.5 * (attempt + 1))


class AlarmService:
    def __init__(self, node: ControllerNode) -> None:
        s = node.settings
        self.node = node
        self.rules = parse_rules(s.alarm_rules)
        self.interval_s = s.alarm_interval_ms / 1000
        self.alive_ms = s.balance_alive_ms
        self.book = AlarmBook(self.rules)
        self.lock = threading.Lock()
        self._led_since: float | None = None  # monotonic time this node became leader
        self._reseed = False  # rebuild the book from the replicated record at the next round
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="alarm-poll")
        self._channels: dict[str, grpc.Channel] = {}  # one per broker node, kept
        self._channels_lock = threading.Lock()
        self.webhook = Webhook(s.alarm_webhook_url) if s.alarm_webhook_url else None
        self._thread = threading.Thread(target=self._run, name="alarms", daemon=True)

    def start(self) -> None:
        if self.rules:
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for ch in self._channels.values():
            ch.close()
        if self.webhook is not None:
            self.webhook.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # one bad round must not end the alarms
                log.exception("controller.alarm_round_failed")

    def tick(self) -> None:
        if not self.node.rlog.is_leader_ready():
            if self._led_since is not None:  # lost the lead: the next leader judges
                self._led_since = None
                with self.lock:
                    self.book = AlarmBook(self.rules, events=self.book.events)
            return
        if self._led_since is None or self._reseed:
            if not self.node.caught_up():
                return  # the replicated firing alarms first
            if self._led_since is None:
                self._led_since = time.monotonic()
            self._seed()
        now_ms = int(time.time() * 1000)
        observed = self.measure(now_ms)
        with self.lock:
            events = self.book.evaluate(now_ms, observed)
        leader_id = self.node.settings.node_id
        for e in events:
            # Replicated before it is told: a new leader continues from it (no second firing;
            # it posts the resolution). Not committed: this round's changes are derived again.
            change = AlarmChange(e.status, e.rule, e.subject, e.since_ms, e.value)
            if not self.node.commit_alarm(change):
                log.warning(
                    "controller.alarm_not_committed rule=%r subject=%s status=%s",
                    e.rule,
                    e.subject,
                    e.status,
                )
                self._reseed = True
                break
            fn = log.warning if e.status == "firing" else log.info
            fn(
                "controller.alarm_%s rule=%r subject=%s value=%g since_ms=%d",
                e.status,
                e.rule,
                e.subject,
                e.value,
                e.since_ms,
            )
            if self.webhook is not None:
                self.webhook.post(event_json(e, leader_id))

    def _seed(self) -> None:
        """A fresh book holding the replicated firing alarms (recent events kept)."""
        with self.lock:
            book = AlarmBook(self.rules, events=self.book.events)
            for a in self.node.firing_alarms():
                book.restore(a.rule, a.subject, a.since_ms, a.value)
            self.book = book
        self._reseed = False

    # ---- measuring ----------------------------------------------------------------------------

    def measure(self, now_ms: int) -> dict[Kind, dict[str, float | None]]:
        kinds = {r.kind for r in self.rules}
        records = self.node.records()
        out: dict[Kind, dict[str, float | None]] = {}
        assert self._led_since is not None
        if Kind.NO_LEADER in kinds and (
            (time.monotonic() - self._led_since) * 1000 >= self.alive_ms
        ):
            seen = self.node.liveness_view()
            out[Kind.NO_LEADER] = {
                g.broker_group: 0.0
                if g.leader_node_id and _alive(seen.get((g.broker_group, g.leader_node_id)),
                                               now_ms, self.alive_ms)
                else 1.0
                for g in records
            }  # fmt: skip
        if kinds & BROKER_KINDS:
            out.update(self._broker_kinds(kinds, records))
        return out

    def _broker_kinds(
        self, kinds: set[Kind], records: list[GroupRecord]
    ) -> dict[Kind, dict[str, float | None]]:
        """Per node None where the node (or, for follower_behind, its leader) did not answer:
        known but unmeasured, so its alarm neither fires nor resolves this round."""
        calls = [
            (g.broker_group, node_id, address)
            for g in records
            for node_id, address in sorted(g.members.items())
        ]
        statuses = list(self._pool.map(lambda c: self._status(c[2]), calls))
        return observe(kinds, [(g, n) for g, n, _ in calls], statuses)

    def _status(self, address: str) -> broker_pb2.BrokerStatus | None:
        with self._channels_lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = tls.channel(address, CHANNEL_LIVENESS)
                self._channels[address] = ch
        try:
            return broker_pb2_grpc.BrokerStub(ch).GetBrokerStatus(
                broker_pb2.GetBrokerStatusRequest(include_lags=True),
                timeout=STATUS_TIMEOUT_S,
                metadata=call_metadata(self.node.signer),
            )
        except grpc.RpcError:
            return None

    def snapshot(self) -> tuple[list[Active], list[Event]]:
        with self.lock:
            return list(self.book.active()), list(self.book.events)


def observe(
    kinds: set[Kind],
    nodes: list[tuple[str, str]],
    statuses: list[broker_pb2.BrokerStatus | None],
) -> dict[Kind, dict[str, float | None]]:
    """The broker kinds' values from one round's answers, values in and out: `nodes` are
    (broker group, node id), `statuses` their answers in the same order (None: no answer).
    Per node None where the node (or, for follower_behind, its leader) did not answer; the
    leaders' kinds (group_lag, dlq_growth, retention_loss) only when every group's leader did."""
    disk: dict[str, float | None] = {}
    storage: dict[str, float | None] = {}
    behind: dict[str, float | None] = {}
    lag: dict[str, float | None] = {}
    dlq: dict[str, float | None] = {}
    loss: dict[str, float | None] = {}
    complete = True  # every group's leader answered
    by_group: dict[str, list[tuple[str, broker_pb2.BrokerStatus | None]]] = {}
    for (group, node_id), st in zip(nodes, statuses, strict=True):
        by_group.setdefault(group, []).append((node_id, st))
        disk[f"{group}/{node_id}"] = st.disk_used_ratio if st is not None else None
        storage[f"{group}/{node_id}"] = None if st is None else float(bool(st.storage_error))
    for group, members in by_group.items():
        leaders = [st for _, st in members if st is not None and st.role == common_pb2.LEADER]
        if not leaders:
            complete = False
            for node_id, _ in members:
                behind[f"{group}/{node_id}"] = None
            continue
        leader = max(leaders, key=lambda st: st.term)
        for node_id, st in members:
            if st is None:
                behind[f"{group}/{node_id}"] = None
            elif st is not leader:
                behind[f"{group}/{node_id}"] = float(max(0, leader.commit_index - st.applied_index))
        for gl in leader.group_lags:
            key = f"{gl.consumer_group}/{gl.topic}"
            lag[key] = (lag.get(key) or 0.0) + gl.lag
        for gl in leader.next_cut_losses:
            key = f"{gl.consumer_group}/{gl.topic}"
            loss[key] = (loss.get(key) or 0.0) + gl.lag
        for t in leader.topics:
            if t.topic.startswith(DLQ_PREFIX):
                name = t.topic.removeprefix(DLQ_PREFIX)
                dlq[name] = (dlq.get(name) or 0.0) + sum(q.max_offset for q in t.queues)
    out: dict[Kind, dict[str, float | None]] = {}
    if Kind.DISK_USED in kinds:
        out[Kind.DISK_USED] = disk
    if Kind.FOLLOWER_BEHIND in kinds:
        out[Kind.FOLLOWER_BEHIND] = behind
    if Kind.STORAGE_ERROR in kinds:
        out[Kind.STORAGE_ERROR] = storage
    if complete and Kind.GROUP_LAG in kinds:
        out[Kind.GROUP_LAG] = lag
    if complete and Kind.DLQ_GROWTH in kinds:
        out[Kind.DLQ_GROWTH] = dlq
    if complete and Kind.RETENTION_LOSS in kinds:
        out[Kind.RETENTION_LOSS] = loss
    return out


def _alive(seen: Seen | None, now_ms: int, alive_ms: int) -> bool:
    return seen is not None and seen.alive(now_ms, alive_ms)
