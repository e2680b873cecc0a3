"""The chaos runner's storage faults (issue 25): make the target hold what the fault needs (a
sealed journal segment: filler sends), change one byte of its files (chaos/corruption.py), watch
its status until it reports the fault (storage_error) and until it has repaired it, and at the
end compare every (queue, offset) each replica of the group serves. Judges with bounds; it never
repairs anything itself.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console

from raftmq.chaos.corruption import (
    Flip,
    NothingToCorrupt,
    flip_index_row,
    flip_sealed_record,
    journal_dir,
    sealed_segments,
    store_dir,
)
from raftmq.client.admin import Admin
from raftmq.common import tls
from raftmq.common.auth_client import client_signer, signed
from raftmq.common.errors import RaftMQError
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.ops.cluster_runner import ClusterRunner, broker_status
from raftmq.ops.cluster_spec import ProcessSpec

FILLER_TOPIC = "chaos-filler"  # filler sends go here, never to the workload's topic
FILLER_BODY = b"f" * (60 << 10)
FILLER_BATCH = 8  # messages per filler send (~480 KiB)
SEAL_WAIT_S = 30.0  # for the target's first sealed segment
FIND_WAIT_S = 20.0  # for rows to corrupt in mid-queue
WATCH_EVERY_S = 0.1
REPORT_BOUND_S = 10.0  # from the flip to the target's storage_error: "within seconds"
PULL_BATCH = 256
RPC_TIMEOUT_S = 10.0


class StorageFaultError(RuntimeError):
    """The step could not corrupt anything (the files never held it): not a verdict."""


@dataclass
class Watch:
    """One corruption: what changed, and when (seconds after the flip) the target said so and
    when it no longer did (repaired)."""

    kind: str
    target: str
    flip: Flip
    flipped_wall: float  # time.time(): the node's log lines carry wall-clock times
    reported_s: float | None = None
    repaired_s: float | None = None
    errors: list[str] = field(default_factory=list)  # the storage_error texts seen

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "flip": self.flip.to_json(),
            "reported_s": None if self.reported_s is None else round(self.reported_s, 2),
            "repaired_s": None if self.repaired_s is None else round(self.repaired_s, 2),
            "storage_error": self.errors[:1],
        }

    def problem(self) -> str | None:
        if self.reported_s is None:
            return f"{self.kind} on {self.target} never reported"
        if self.reported_s > REPORT_BOUND_S:
            return f"{self.kind} on {self.target} reported after {self.reported_s:.1f} s"
        if self.repaired_s is None:
            return f"{self.kind} on {self.target} never repaired"
        return None


class StorageFaults:
    def __init__(
        self,
        runner: ClusterRunner,
        group: str,
        topic: str,
        namesrv: str,
        console: Console,
        seed: int,
    ) -> None:
        self.runner = runner
        self.group = group
        self.topic = topic
        self.namesrv = namesrv
        self.console = console
        self.rng = random.Random(seed ^ 0xC0FFEE)
        self.watches: list[Watch] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.compared: dict[str, int] = {}  # (queue, offset) slots each replica served

    def _process(self, name: str) -> ProcessSpec:
        return next(p for p in self.runner.processes() if p.name == name)

    def inject(self, kind: str, target: str, leader: str) -> None:
        """Corrupt `target`'s files as `kind` says ("corrupt-segment", "corrupt-row",
        "forge-row") and start watching its status."""
        p = self._process(target)
        if kind == "corrupt-segment":
            self._seal(p, self._process(leader))
            flip = flip_sealed_record(journal_dir(p.data_dir), self.rng)
        else:
            flip = self._retry(
                lambda: flip_index_row(
                    store_dir(p.data_dir), self.topic, self.rng, well_formed=kind == "forge-row"
                )
            )
        log_from = _size(p.data_dir / "process.log")
        w = Watch(kind, target, flip, time.time())
        self.watches.append(w)
        self.console.log(f"[yellow]corrupted[/] {target}: {flip.what} ({flip.path})")
        t = threading.Thread(target=self._watch, args=(w, p, log_from), daemon=True)
        t.start()
        self._threads.append(t)

    def _retry(self, flip: Any) -> Flip:
        deadline = time.monotonic() + FIND_WAIT_S
        while True:
            try:
                result: Flip = flip()
                return result
            except NothingToCorrupt as exc:
                if time.monotonic() > deadline:
                    raise StorageFaultError(str(exc)) from exc
                time.sleep(0.2)

    def _seal(self, target: ProcessSpec, leader: ProcessSpec) -> None:
        """Filler sends through the leader until the target has a sealed journal segment."""
        journal = journal_dir(target.data_dir)
        if sealed_segments(journal):
            return
        # (RaftMQError: made by an earlier fault of this run)
        with Admin(self.namesrv) as admin, contextlib.suppress(RaftMQError):
            admin.create_topic(FILLER_TOPIC, queues=1)
        deadline = time.monotonic() + SEAL_WAIT_S
        address = f"{leader.host}:{leader.ports[0]}"
        with signed(tls.channel(address), client_signer()) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            while not sealed_segments(journal):
                if time.monotonic() > deadline:
                    raise StorageFaultError(f"{target.name} has no sealed segment")
                try:
                    stub.SendMessage(
                        broker_pb2.SendMessageRequest(
                            topic=FILLER_TOPIC,
                            queue_id=0,
                            messages=[common_pb2.Message(body=FILLER_BODY)] * FILLER_BATCH,
                        ),
                        timeout=RPC_TIMEOUT_S,
                    )
                except grpc.RpcError:
                    time.sleep(0.2)  # a leader change under the filler: the next send retries

    def _watch(self, w: Watch, p: ProcessSpec, log_from: int) -> None:
        """Reported: the node's `storage.corrupt_record` line (a repair from a peer can take
        milliseconds, faster than any status poll) or its status; repaired: its
        `storage.record_repaired` line after that. Times are seconds after the flip."""
        address = f"{p.host}:{p.ports[0]}"
        log = p.data_dir / "process.log"
        while not self._stop.wait(WATCH_EVERY_S):
            lines, log_from = _new_lines(log, log_from)
            for line in lines:
                if "storage.corrupt_record" in line and w.reported_s is None:
                    w.reported_s = _log_time(line) - w.flipped_wall
                    w.errors.append(line.split(" ", 4)[-1][:300])
                elif "storage.record_repaired" in line and w.reported_s is not None:
                    w.repaired_s = _log_time(line) - w.flipped_wall
            if w.repaired_s is not None:
                return
            st = broker_status(p.name, p.group, address)
            if st.storage_error and w.reported_s is None:
                w.reported_s = time.time() - w.flipped_wall
                w.errors.append(st.storage_error)

    def final_errors(self) -> list[str]:
        """Each corrupted node's storage_error at the end: it must be empty (repaired)."""
        out = []
        for name in sorted({w.target for w in self.watches}):
            p = self._process(name)
            st = broker_status(p.name, p.group, f"{p.host}:{p.ports[0]}")
            if st.storage_error:
                out.append(f"{name} still reports {st.storage_error[:200]}")
        return out

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def problems(self) -> list[str]:
        return [p for w in self.watches if (p := w.problem()) is not None] + self.final_errors()

    def compare_replicas(self, queues: int) -> list[str]:
        """Every (queue, offset) of the topic read from each node of the group (follower
        reads): the same message everywhere. Differences and refusals are problems."""
        nodes = [p for p in self.runner.processes() if p.group == self.group]
        seen: dict[str, dict[tuple[int, int], bytes]] = {}
        problems: list[str] = []
        for p in nodes:
            try:
                seen[p.name] = _read_all(f"{p.host}:{p.ports[0]}", self.topic, queues)
            except grpc.RpcError as exc:
                problems.append(f"{p.name} did not serve {self.topic}: {exc.code().name}")
        if len(seen) < 2:
            return problems
        names = sorted(seen)
        common = set.intersection(*(set(seen[n]) for n in names))
        for slot in sorted(common):
            bodies = {n: seen[n][slot] for n in names}
            if len(set(bodies.values())) > 1:
                problems.append(f"replicas differ at {self.topic}/{slot[0]} offset {slot[1]}")
        self.compared = {n: len(seen[n]) for n in names}
        return problems[:20]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Whole lines appended to `path` since `offset`, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8", "replace").splitlines(), offset + end


def _log_time(line: str) -> float:
    """The wall-clock time of a process log line ("2026-11-27 14:39:19,129 ...")."""
    stamp, _, ms = line[:23].partition(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms or 0) / 1000


def _read_all(address: str, topic: str, queues: int) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    with signed(tls.channel(address), client_signer()) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        for q in range(queues):
            offset = 0
            while True:
                resp = stub.PullMessage(
                    broker_pb2.PullMessageRequest(
                        consumer_group="chaos-compare",
                        topic=topic,
                        queue_id=q,
                        offset=offset,
                        max_count=PULL_BATCH,
                        allow_follower_read=True,
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
                for m in resp.messages:
                    out[q, m.queue_offset] = m.message.body
                if not resp.messages or resp.next_offset >= resp.max_offset:
                    break
                offset = resp.next_offset
    return out
