"""The dispatch path alone, in one process: committed entries shaped like W1's (each entry a
frame of `--chunks` idempotent queue batches of `--messages` 1 KiB messages, spread over 8
queues) through `Dispatcher.apply` and `MessageStore.apply`, as the dispatcher thread runs them
(`--txn` entries per lmdb transaction), v2 stored batches (`--v1`: the format before issue
24). CPU per message, independent of Raft and the network,
so two checkouts compare on a shared machine (PYTHONPATH selects the code):

    PYTHONPATH=$PWD .venv/bin/python bench/dispatch_bench.py [--profile]

Prints one JSON line (best and median of `--rounds` rounds, us per message).

`--thread` measures a whole dispatch round instead, as a node runs it under W2: a one-node
NativeLog (its journal and Raft loop thread) and a DispatcherThread with the node's listener of
outcomes; each W2-shaped entry (one idempotent 1 KiB message, its offset placed as the leader
places it) is submitted and waited for before the next. It reports the dispatcher thread's CPU
per entry (wake-up, journal read, Dispatcher.apply, MessageStore.apply, listeners) and, with
`--split`, that CPU by step (each step timed with the thread's CPU clock, which adds ~1 us a
step).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftmq.broker.dispatch import Dispatcher, PendingState
from raftmq.broker.dispatcher_thread import DispatcherThread
from raftmq.broker.outcomes import OutcomeBook
from raftmq.broker.store import MessageStore
from raftmq.broker.txn_apply import TxnApplier, TxnSettings
from raftmq.common import record_batch, stored_batch
from raftmq.common.message import Message
from raftmq.common.record_batch import ProduceBatch, ProducerSequence
from raftmq.raftlog.config import RaftLogConfig
from raftmq.raftlog.native_log import NativeLog
from raftmq.raftlog.record import Entry
from tests.harness.local_cluster import free_ports

TOPIC = "bench-dispatch"
QUEUES = 8


def make_entries(
    start_index: int,
    n_entries: int,
    chunks: int,
    messages: int,
    body: int,
    seqs: dict[int, int],
    v1: bool = False,
) -> list[Entry]:
    payload = b"x" * body
    out = []
    q = 0
    for i in range(n_entries):
        parts = []
        for _ in range(chunks):
            queue = q % QUEUES
            q += 1
            msgs = tuple(Message(TOPIC, payload, born_host="127.0.0.1:1") for _ in range(messages))
            first = seqs.get(queue, 0)
            seqs[queue] = first + messages
            producer = ProducerSequence("bench-p", first, True)
            if v1:
                batch = ProduceBatch(TOPIC, queue, 1_700_000_000_000 + i, msgs, producer)
                parts.append(record_batch.encode(batch))
                continue
            # what the servers store since issue 24: the producer's v2 batch, stamped
            buf = bytearray(stored_batch.encode_batch(TOPIC, queue, msgs, producer, "127.0.0.1:1"))
            stored_batch.stamp(buf, 0, 1_700_000_000_000 + i)
            parts.append(bytes(buf))
        out.append(Entry(start_index + i, 1, tuple(parts)))
    return out


def run(args: argparse.Namespace) -> dict[str, object]:
    per_msg: list[float] = []
    profiler = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as tmp, MessageStore(tmp) as store:
        dispatcher = Dispatcher()
        seqs: dict[int, int] = {}
        index = 1
        for _ in range(args.rounds):
            entries = make_entries(
                index, args.entries, args.chunks, args.messages, args.body, seqs, args.v1
            )
            index += len(entries)
            t0 = time.process_time()
            if profiler is not None:
                profiler.enable()
            for at in range(0, len(entries), args.txn):
                pending = PendingState(store)
                outputs = []
                for entry in entries[at : at + args.txn]:
                    out = dispatcher.apply(entry, pending)
                    pending.absorb(out)
                    outputs.append(out)
                store.apply(outputs)
            if profiler is not None:
                profiler.disable()
            spent = time.process_time() - t0
            per_msg.append(spent / (args.entries * args.chunks * args.messages) * 1e6)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return {
        "us_per_msg_best": round(min(per_msg), 2),
        "us_per_msg_median": round(statistics.median(per_msg), 2),
        "chunks": args.chunks,
        "messages": args.messages,
        "txn": args.txn,
        "format": "v1" if args.v1 else "v2",
    }


def w2_chunk(queue: int, offset: int, body: int) -> bytes:
    """What W2's leader proposes: one idempotent message, stamped, its base offset placed."""
    msgs = (Message(TOPIC, b"x" * body, born_host="vm"),)
    producer = ProducerSequence("bench-p", offset, False)
    buf = bytearray(stored_batch.encode_batch(TOPIC, queue, msgs, producer, "vm"))
    stored_batch.stamp(buf, 0, int(time.time() * 1000))
    stored_batch.place_offset(buf, offset)
    return bytes(buf)


def _timed(obj: Any, name: str, key: str, spent: Counter[str]) -> None:
    """Wrap obj.name so that its thread CPU adds up under `key`."""
    f: Callable[..., Any] = getattr(obj, name)
    clock = time.thread_time

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return f(*args, **kwargs)
        finally:
            spent[key] += clock() - t0

    setattr(obj, name, timed)


def run_thread(args: argparse.Namespace) -> dict[str, object]:
    spent: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        (port,) = free_ports(1)
        rlog = NativeLog(RaftLogConfig(f"127.0.0.1:{port}", (), Path(tmp) / "raft"))
        try:
            deadline = time.monotonic() + 10
            while not rlog.is_leader():
                if time.monotonic() > deadline:
                    raise RuntimeError("the one-node log elected no leader")
                time.sleep(0.01)
            store = MessageStore(Path(tmp) / "store")
            book = OutcomeBook(store.dispatched_index)
            if args.split:
                _timed(book, "record", "listener", spent)
            dispatcher = Dispatcher(transactions=TxnApplier(TxnSettings(), ()))
            thread = DispatcherThread(
                rlog, store, dispatcher=dispatcher, on_progress=book.record, name="dispatch-b"
            )
            if args.split:
                _timed(rlog, "wait_committed", "wait", spent)
                _timed(rlog, "read_from", "read", spent)
                _timed(dispatcher, "apply", "apply", spent)
                _timed(store, "apply", "store", spent)
                _timed(thread, "_dispatch", "dispatch", spent)
            counts: dict[int, int] = {}

            def send(i: int) -> None:
                queue = i % QUEUES
                offset = counts.get(queue, 0)
                counts[queue] = offset + 1
                done = rlog.submit(w2_chunk(queue, offset, args.body)).result(10)
                if not thread.wait_dispatched(done.index, 10):
                    raise RuntimeError(f"entry {done.index} not dispatched in 10 s")

            with thread:
                for i in range(args.warmup):
                    send(i)
                ident = next(t.ident for t in threading.enumerate() if t.name == "dispatch-b")
                assert ident is not None
                clock = time.pthread_getcpuclockid(ident)
                spent.clear()
                c0, w0 = time.clock_gettime(clock), time.perf_counter()
                for i in range(args.warmup, args.warmup + args.entries):
                    send(i)
                cpu, wall = time.clock_gettime(clock) - c0, time.perf_counter() - w0
            store.close()
        finally:
            rlog.close(transfer_leadership=False)
    n = args.entries
    row: dict[str, object] = {
        "name": "dispatch_round",
        "entries": n,
        "dispatcher_us_per_entry": round(cpu / n * 1e6, 1),
        "wall_us_per_entry": round(wall / n * 1e6, 1),
    }
    if args.split:
        steps = {k: round(v / n * 1e6, 1) for k, v in spent.items()}
        # _dispatch holds apply, store and the listener; the rest of the round is the loop's
        steps["dispatch_rest"] = round(
            steps["dispatch"] - steps["apply"] - steps["store"] - steps["listener"], 1
        )
        steps["round_rest"] = round(
            cpu / n * 1e6 - steps["wait"] - steps["read"] - steps["dispatch"], 1
        )
        row["split_us_per_entry"] = steps
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--entries", type=int, default=300, help="entries per round")
    ap.add_argument("--chunks", type=int, default=7, help="queue batches per entry (W1: ~6.5)")
    ap.add_argument("--messages", type=int, default=7, help="messages per batch (W1: ~7.4)")
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--txn", type=int, default=2, help="entries per lmdb transaction")
    ap.add_argument("--profile", action="store_true", help="cProfile the dispatch, top 25")
    ap.add_argument("--v1", action="store_true", help="v1 record batches (stores before v2)")
    ap.add_argument("--thread", action="store_true", help="whole rounds of a DispatcherThread")
    ap.add_argument("--warmup", type=int, default=300, help="--thread: entries before measuring")
    ap.add_argument("--split", action="store_true", help="--thread: CPU by step")
    args = ap.parse_args()
    if args.thread:
        if args.entries == ap.get_default("entries"):
            args.entries = 2000
        print(json.dumps(run_thread(args)), flush=True)
        return
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
