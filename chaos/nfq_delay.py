"""A packet delayer for kernels without netem (chaos.md pitfall 1): binds an nfnetlink queue over
a raw netlink socket, holds each queued packet delay_ms +- jitter_ms, then accepts it (jitter
reorders packets, as netem's does). Packets reach the queue through an iptables NFQUEUE rule
that chaos/netns.py adds in the same namespace. Standard library only; never drops a packet it
was given; stops on SIGTERM, releasing what it holds. Run inside the host's namespace:
`python -m chaos.nfq_delay --queue 7 --delay-ms 200 --jitter-ms 50`."""

from __future__ import annotations

import argparse
import errno
import heapq
import itertools
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1  # we never look at payloads: the kernel sends headers only
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")
NF_ACCEPT = 1
KERNEL_QUEUE_MAXLEN = 8192  # packets waiting in the kernel for us; beyond it: fail open
MAX_HELD_DEFAULT = 20_000  # packets held here at once; beyond it a packet is accepted at once
RECV_BUFFER_BYTES = 4 << 20
ACK_TIMEOUT_S = 5.0


class DelayerError(RuntimeError):
    """The kernel refused the queue configuration, or the socket failed."""


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def encode(msg_type: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    """One nfnetlink message of the queue subsystem (nfgenmsg's res_id is big-endian)."""
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg_type
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), kind, flags, seq, 0) + body


def config_messages(queue: int) -> list[bytes]:
    """Bind the queue, ask for metadata only, bound its length and make it fail open (a full
    queue passes packets undelayed rather than dropping them). Each asks for an ACK."""
    flags = NLM_F_REQUEST | NLM_F_ACK
    cmd = struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)
    params = struct.pack("!IB", 0xFFFF, NFQNL_COPY_META)  # a packed 5-byte struct
    maxlen = struct.pack("!I", KERNEL_QUEUE_MAXLEN)
    fail_open = _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)) + _attr(
        NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)
    )
    return [
        encode(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, cmd), 1, flags),
        encode(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_PARAMS, params), 2, flags),
        encode(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_QUEUE_MAXLEN, maxlen), 3, flags),
        encode(NFQNL_MSG_CONFIG, queue, fail_open, 4, flags),
    ]


def verdict_message(queue: int, packet_id: int) -> bytes:
    hdr = struct.pack("!II", NF_ACCEPT, packet_id)
    return encode(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR, hdr), 0)


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one netlink datagram held: queued packet ids, ACKed sequence numbers, errors."""

    packet_ids: tuple[int, ...]
    acked: tuple[int, ...]
    errors: tuple[tuple[int, int], ...]  # (seq, errno)


def decode(data: bytes) -> Decoded:
    ids: list[int] = []
    acked: list[int] = []
    errors: list[tuple[int, int]] = []
    off = 0
    while off + NLMSG_HDR.size <= len(data):
        length, kind, _flags, seq, _pid = NLMSG_HDR.unpack_from(data, off)
        if length < NLMSG_HDR.size or off + length > len(data):
            break  # truncated: nothing after it can be trusted
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, off + NLMSG_HDR.size)
            if err:
                errors.append((seq, -err))
            else:
                acked.append(seq)
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            a, end = off + NLMSG_HDR.size + 4, off + length  # attributes follow nfgenmsg
            while a + 4 <= end:
                alen, akind = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if akind & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, a + 4)[0])
                a += (alen + 3) & ~3
        off += (length + 3) & ~3
    return Decoded(tuple(ids), tuple(acked), tuple(errors))


class Delayer:
    """Holds packet ids in a heap ordered by release time. Bounded: at most max_held."""

    def __init__(self, sock: socket.socket, queue: int, delay_ms: float, jitter_ms: float,
                 max_held: int, rng: random.Random) -> None:  # fmt: skip
        self.sock, self.queue = sock, queue
        self.delay_ms, self.jitter_ms = delay_ms, jitter_ms
        self.max_held = max_held
        self.rng = rng
        self._held: list[tuple[float, int, int]] = []  # (release at, arrival order, packet id)
        self._order = itertools.count()
        self.overflowed = 0

    def take(self, packet_id: int, now: float) -> None:
        if len(self._held) >= self.max_held:
            self.overflowed += 1
            self._accept(packet_id)
            return
        d_ms = max(0.0, self.delay_ms + self.rng.uniform(-self.jitter_ms, self.jitter_ms))
        heapq.heappush(self._held, (now + d_ms / 1000, next(self._order), packet_id))

    def release_due(self, now: float) -> float | None:
        """Accepts every packet whose time has come; returns seconds until the next one."""
        while self._held and self._held[0][0] <= now:
            self._accept(heapq.heappop(self._held)[2])
        return self._held[0][0] - now if self._held else None

    def release_all(self) -> None:
        while self._held:
            self._accept(heapq.heappop(self._held)[2])

    def _accept(self, packet_id: int) -> None:
        self.sock.send(verdict_message(self.queue, packet_id))


def _bind(sock: socket.socket, queue: int) -> None:
    msgs = config_messages(queue)
    for m in msgs:
        sock.send(m)
    waiting = set(range(1, len(msgs) + 1))
    deadline = time.monotonic() + ACK_TIMEOUT_S
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise DelayerError(f"no answer from nfnetlink_queue for queue {queue}")
        got = decode(sock.recv(65536))
        for seq, err in got.errors:
            raise DelayerError(f"binding queue {queue} failed (step {seq}): {os_error(err)}")
        waiting -= set(got.acked)


def os_error(err: int) -> str:
    return f"{errno.errorcode.get(err, str(err))} ({err})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--queue", type=int, required=True, help="NFQUEUE number (0..65535)")
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--max-held", type=int, default=MAX_HELD_DEFAULT)
    args = ap.parse_args(argv)
    if not 0 <= args.queue <= 0xFFFF or args.delay_ms < 0 or args.jitter_ms < 0:
        ap.error("queue must be 0..65535 and delay/jitter not negative")
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    # The wake-up pipe makes select() return on SIGTERM at once; otherwise Python resumes the
    # wait after the handler (PEP 475) and a stop would take up to the select timeout.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.bind((0, 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
        # A burst that overflows the socket buffer must not kill the delayer with ENOBUFS.
        sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        _bind(sock, args.queue)
    except (OSError, DelayerError) as exc:
        print(f"nfq_delay.error queue={args.queue} {exc}", file=sys.stderr, flush=True)
        return 1
    print("nfq_delay.ready", flush=True)
    d = Delayer(sock, args.queue, args.delay_ms, args.jitter_ms, args.max_held, random.Random())
    try:
        while not stop:
            wait_s = d.release_due(time.monotonic())
            timeout = 1.0 if wait_s is None else min(wait_s, 1.0)
            ready = select.select([sock.fileno(), wake_r], [], [], max(0.0, timeout))[0]
            if sock.fileno() not in ready:
                continue
            for _ in range(256):  # drain what is queued, bounded so releases are not starved
                try:
                    data = sock.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:
                        continue
                    raise
                now = time.monotonic()
                for packet_id in decode(data).packet_ids:
                    d.take(packet_id, now)
    finally:
        # Whatever is held goes out undelayed rather than being dropped with the socket.
        d.release_all()
        sock.close()
    if d.overflowed:
        print(f"nfq_delay.overflowed packets={d.overflowed}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
