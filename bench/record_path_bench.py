"""The record path before and after issue 24, per message, in one process (A vs B in one run):
(A) the SEND_BATCHES path: the SDK's protobuf per message and frame, the leader's parse,
protobuf -> Message, validation and v1 encode, the dispatcher's v1 scan; (B) the SEND_STORED
path: one encode_batch per queue batch and the binary frame, the leader's check_batch and stamp,
the dispatcher's reads of the v2 header and tables; and the consumer's decode of a pull of those
batches, eager (A) or lazy (B). No I/O, no Raft: the CPU each side's Python spends on the
record. Relative figures only (shared machine: noisy).

Run: `.venv/bin/python bench/record_path_bench.py [--batches 8 --per-batch 8 --body 1024]`
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import time
from collections.abc import Callable
from itertools import repeat

from raftmq.broker.convert import message_from_pb
from raftmq.client.messages import ReceivedMessage
from raftmq.client.raw_batch import decode_batches, received_messages
from raftmq.common import record_batch, stored_batch, stored_send
from raftmq.common.filter.tag import tag_hash
from raftmq.common.message import Message as Msg
from raftmq.common.message import MessageLimits, validate_messages
from raftmq.common.pb import broker_pb2, common_pb2

TOPIC = "bench"
HOST = "bench-host"
LIMITS = MessageLimits()


def best_us(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=8, help="queue batches per frame (W1: 8)")
    ap.add_argument("--per-batch", type=int, default=8, help="messages per batch (W1: ~8)")
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    nb, per = args.batches, args.per_batch
    bodies = [[os.urandom(args.body) for _ in range(per)] for _ in range(nb)]
    msgs = [[Msg(TOPIC, b, None, (), {}, 0, 1, HOST) for b in bs] for bs in bodies]
    n = nb * per

    # (A) today's SEND_BATCHES
    def a_client() -> bytes:
        wires = [
            broker_pb2.SendMessageRequest(
                topic=TOPIC,
                queue_id=q,
                messages=[
                    common_pb2.Message(
                        body=m.body,
                        tags=m.tags or "",
                        keys=m.keys,
                        properties=m.properties,
                        born_timestamp_ms=m.born_timestamp_ms,
                        born_host=m.born_host,
                    )
                    for m in ms
                ],
            )
            for q, ms in enumerate(msgs)
        ]
        return broker_pb2.SendBatchesRequest(batches=wires).SerializeToString()

    frame_a = a_client()

    def a_leader() -> list[bytes]:
        req = broker_pb2.SendBatchesRequest.FromString(frame_a)
        out = []
        for b in req.batches:
            messages = [message_from_pb(b.topic, m) for m in b.messages]
            validate_messages(messages, LIMITS, allow_system_topic=True)
            batch = record_batch.ProduceBatch(b.topic, b.queue_id, 1, tuple(messages), None)
            out.append(record_batch.encode(batch))
        return out

    chunks_a = a_leader()

    def a_dispatch() -> None:
        for c in chunks_a:
            scan = record_batch.scan_produce(c)
            tags = set(scan.tags)
            hashes = {t: tag_hash(t) for t in tags}
            tuple([hashes[t] for t in scan.tags])

    # (B) SEND_STORED
    def b_client() -> bytes:
        encoded = [stored_batch.encode_batch(TOPIC, q, ms, None, HOST) for q, ms in enumerate(msgs)]
        return stored_send.encode_request(encoded, 0)

    frame_b = b_client()

    def b_leader() -> list[bytes]:
        _, views = stored_send.decode_request(memoryview(frame_b), 4096)
        out = []
        for v in views:
            stored_batch.check_batch(v)
            buf = bytearray(v)
            stored_batch.stamp(buf, 0, 1)
            out.append(bytes(buf))
        return out

    chunks_b = b_leader()

    def b_dispatch() -> None:
        for c in chunks_b:
            h = stored_batch.read_header(c)
            offs = stored_batch.message_offsets(c, h).tolist()
            ends = offs[1:]
            ends.append(h.total_bytes - h.records_at)
            tuple(map(operator.sub, ends, offs))
            tuple(map(operator.add, offs, repeat(h.records_at)))
            tuple(stored_batch.tag_hashes(c, h).tolist())

    # The consumer's decode of a pull answer of the v2 batches, reading each body: eager
    # (every field into a Message, a StoredMessage and a ReceivedMessage) against lazy
    # (received_messages: one ReceivedMessage per record, fields decoded when read).
    raws = [
        broker_pb2.RawBatch(
            raft_index=1 + i,
            first_offset=i * per,
            chunk=c,
            positions=range(per),
            byte_offsets=[0] * per,
        )
        for i, c in enumerate(chunks_b)
    ]

    def eager_pull() -> None:
        for q, r in enumerate(raws):
            for m in decode_batches([r], "broker-a", q):
                _ = ReceivedMessage.from_stored(m).body

    def lazy_pull() -> None:
        for q, r in enumerate(raws):
            for m in received_messages([r], "broker-a", q):
                _ = m.body

    for name, a, b in (
        ("client_encode", a_client, b_client),
        ("leader_ingest", a_leader, b_leader),
        ("dispatcher_index", a_dispatch, b_dispatch),
        ("consumer_decode_eager_vs_lazy", eager_pull, lazy_pull),
    ):
        ua, ub = best_us(a, args.repeats) / n, best_us(b, args.repeats) / n
        line = {"part": name, "v1_us_per_msg": round(ua, 3), "v2_us_per_msg": round(ub, 3)}
        line.update(batches=nb, per_batch=per, body=args.body)
        print(json.dumps(line))


if __name__ == "__main__":
    main()
