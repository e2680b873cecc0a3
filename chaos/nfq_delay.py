"""A packet delayer for kernels without netem: binds an nfnetlink queue over a raw netlink
socket, holds each queued packet `delay_ms` +- `jitter_ms` and then accepts it (jitter reorders
packets, as netem's does). Packets reach the queue through an iptables NFQUEUE rule set up by
chaos/netns.py. No third-party code; stops on SIGTERM. Run inside the host's namespace:
`python -m chaos.nfq_delay --queue 7 --delay-ms 200 --jitter-ms 50`."""

from __future__ import annotations

import argparse
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NF_ACCEPT = 1
MAX_HELD = 20_000  # packets held at once; beyond it a packet is accepted at once (bounded)


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, seq: int) -> bytes:
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs  # nfgenmsg: res_id is BE
    header = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type,
                         NLM_F_REQUEST, seq, 0)  # fmt: skip
    return header + body


def bind(sock: socket.socket, queue: int) -> None:
    cmd = struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)
    sock.send(_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, cmd), 1))
    params = struct.pack("!IB", 0xFFFF, NFQNL_COPY_META)  # packed struct: 5 bytes
    sock.send(_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_PARAMS, params), 2))
    sock.send(_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_QUEUE_MAXLEN,
                                                      struct.pack("!I", 8192)), 3))  # fmt: skip


def packet_ids(data: bytes) -> list[int]:
    """The packet ids of every NFQNL_MSG_PACKET in one netlink datagram."""
    ids = []
    off = 0
    while off + 16 <= len(data):
        length, msg_type = struct.unpack_from("=IH", data, off)
        if length < 16:
            break
        if msg_type == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, off + 16)
            if err != 0:
                raise OSError(-err, f"nfnetlink queue error {err}")
        elif msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            a = off + 20  # after nlmsghdr + nfgenmsg
            end = off + length
            while a + 4 <= end:
                alen, akind = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if (akind & 0x7FFF) == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, a + 4)[0])
                a += (alen + 3) & ~3
        off += (length + 3) & ~3
    return ids


def verdict(sock: socket.socket, queue: int, packet_id: int) -> None:
    hdr = struct.pack("!II", NF_ACCEPT, packet_id)
    sock.send(_message(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR, hdr), 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    args = ap.parse_args(argv)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    bind(sock, args.queue)
    print("nfq_delay.ready", flush=True)
    held: list[tuple[float, int]] = []
    rng = random.Random()
    while not stop:
        now = time.monotonic()
        while held and held[0][0] <= now:
            verdict(sock, args.queue, heapq.heappop(held)[1])
        timeout = max(0.0, held[0][0] - now) if held else 0.2
        try:
            ready, _, _ = select.select([sock], [], [], min(timeout, 0.2))
        except InterruptedError:
            continue
        if not ready:
            continue
        data = sock.recv(65536)
        now = time.monotonic()
        for pid in packet_ids(data):
            if len(held) >= MAX_HELD:
                verdict(sock, args.queue, pid)
                continue
            d = args.delay_ms + rng.uniform(-args.jitter_ms, args.jitter_ms)
            heapq.heappush(held, (now + max(0.0, d) / 1000, pid))
    for _, pid in held:  # whatever is held goes out undelayed rather than being dropped
        verdict(sock, args.queue, pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
