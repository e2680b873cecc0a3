"""Micro-benchmark of the data server's inbound path without sockets: SEND_STORED-sized frames
(512 x 1 KiB messages, ~540 KiB) arriving in reads of `--read` bytes, decoded and their stored
batch made ready to stamp, the two ways the code has done it (issue 24):

  fed       each read as a new bytes object (what a Protocol's data_received gets: the
            transport's copy) through FrameDecoder.feed, and the batch copied into a bytearray
            to be stamped (what prepare_stored did)
  buffered  each read into FrameDecoder.get_buffer (a BufferedProtocol: the kernel's copy is the
            only one), a large frame straight into a pooled buffer of its own, and the batch
            stamped where it lies

CPU time per frame (thread time, best of `--repeat` runs of `--frames` frames) and per 1 KiB
message. One JSON line per way; writes bench/results/frame_read.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/frame_read_bench.py`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftmq.common import frame, stored_batch, stored_send  # noqa: E402
from raftmq.common.frame import FrameBuffers, FrameDecoder, Hello  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "frame_read.jsonl"


def request_stream(frames: int, messages: int) -> bytes:
    batch = stored_batch.encode_bodies("bench", 0, [(1, [b"x" * 1024] * messages)], None, "h:1")
    payload = stored_send.request_parts([batch], 3000)
    out = [frame.encode_hello(Hello())]
    for rid in range(1, frames + 1):
        out.append(frame.encode_request(rid, 9, payload))
    return b"".join(out)


def fed(stream: bytes, read: int) -> int:
    dec = FrameDecoder(expect_hello=True)
    source = memoryview(stream)
    done = 0
    for pos in range(0, len(stream), read):
        for f in dec.feed(source[pos : pos + read].tobytes()):  # the transport's bytes
            if f.kind is frame.Kind.REQUEST:
                _, batches = stored_send.decode_request(f.payload, 16)
                for b in batches:
                    stored_batch.stamp(bytearray(b), 0, 1)
                done += 1
    return done


def buffered(stream: bytes, read: int, buffers: FrameBuffers) -> int:
    dec = FrameDecoder(expect_hello=True, buffers=buffers)
    pos, done = 0, 0
    while pos < len(stream):
        room = dec.get_buffer()
        n = min(len(room), read, len(stream) - pos)
        room[:n] = stream[pos : pos + n]  # the kernel's copy (recv_into)
        pos += n
        for f in dec.buffer_updated(n):
            if f.kind is frame.Kind.REQUEST:
                _, batches = stored_send.decode_request(f.payload, 16)
                for b in batches:
                    stored_batch.stamp(b if not b.readonly else bytearray(b), 0, 1)
                done += 1
    return done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--messages", type=int, default=512)
    ap.add_argument("--read", type=int, default=64 * 1024)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    stream = request_stream(args.frames, args.messages)
    buffers = FrameBuffers(64 << 20)
    ways = {
        "fed": lambda: fed(stream, args.read),
        "buffered": lambda: buffered(stream, args.read, buffers),
    }
    for way, run in ways.items():
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.thread_time()
            assert run() == args.frames
            best = min(best, time.thread_time() - t0)
        per_frame_us = best / args.frames * 1e6
        rec = {
            "bench": "frame_read",
            "way": way,
            "frame_bytes": (len(stream) - len(frame.encode_hello(Hello()))) // args.frames,
            "read_bytes": args.read,
            "us_per_frame": round(per_frame_us, 1),
            "us_per_msg": round(per_frame_us / args.messages, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        print(json.dumps(rec), flush=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
