"""The dispatch path alone, in one process: committed entries shaped like W1's (each entry a
frame of `--chunks` idempotent queue batches of `--messages` 1 KiB messages, spread over 8
queues) through `Dispatcher.apply` and `MessageStore.apply`, as the dispatcher thread runs them
(`--txn` entries per lmdb transaction), v2 stored batches (`--v1`: the format before issue
24). CPU per message, independent of Raft and the network,
so two checkouts compare on a shared machine (PYTHONPATH selects the code):

    PYTHONPATH=$PWD .venv/bin/python bench/dispatch_bench.py [--profile]

Prints one JSON line (best and median of `--rounds` rounds, us per message).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time

from raftmq.broker.dispatch import Dispatcher, PendingState
from raftmq.broker.store import MessageStore
from raftmq.common import record_batch, stored_batch
from raftmq.common.message import Message
from raftmq.common.record_batch import ProduceBatch, ProducerSequence
from raftmq.raftlog.record import Entry

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
    print(json.dumps(run(ap.parse_args())), flush=True)


if __name__ == "__main__":
    main()
