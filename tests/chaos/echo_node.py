"""Test helper for tests/chaos/test_netns.py, run inside a host's namespace (standard library
only, so it starts with `python -I -S`). Modes:
  serve PORT                         TCP echo on PORT; UDP datagrams on PORT are counted; a TCP
                                     line "stats" answers with that count. Prints "ready".
  probe TIMEOUT_S COUNT IP:PORT...   connects to every target at once and times COUNT echo
                                     round trips; prints {target: {"rtts_ms": [...]}} or
                                     {target: {"error": "..."}} as JSON.
  udp IP PORT COUNT                  sends COUNT datagrams.
  stats IP PORT                      prints the UDP count of the server at IP:PORT.
  hold IP PORT                       connects, prints "connected", waits for the connection to
                                     end and prints how (e.g. "ConnectionAbortedError")."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def serve(port: int) -> None:
    udp_count = 0
    lock = threading.Lock()

    def udp_loop(u: socket.socket) -> None:
        nonlocal udp_count
        while True:
            u.recv(2048)
            with lock:
                udp_count += 1

    def handle(c: socket.socket) -> None:
        with c:
            while data := c.recv(4096):
                if data == b"stats\n":
                    with lock:
                        c.sendall(f"{udp_count}\n".encode())
                    return
                c.sendall(data)

    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port))
    threading.Thread(target=udp_loop, args=(u,), daemon=True).start()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def _probe_one(target: str, timeout_s: float, count: int) -> dict[str, object]:
    ip, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((ip, int(port)), timeout=timeout_s) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rtts = []
            for i in range(count):
                t = time.monotonic()
                c.sendall(b"x%d\n" % i)
                c.recv(64)
                rtts.append(round((time.monotonic() - t) * 1000, 2))
            return {"rtts_ms": rtts}
    except OSError as exc:
        return {"error": type(exc).__name__}


def probe(timeout_s: float, count: int, targets: list[str]) -> None:
    out: dict[str, dict[str, object]] = {}

    def run(t: str) -> None:
        out[t] = _probe_one(t, timeout_s, count)

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print(json.dumps(out))


def main() -> int:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve(int(args[0]))
    elif mode == "probe":
        probe(float(args[0]), int(args[1]), args[2:])
    elif mode == "udp":
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(int(args[2])):
            u.sendto(b"d", (args[0], int(args[1])))
    elif mode == "stats":
        with socket.create_connection((args[0], int(args[1])), timeout=2) as c:
            c.sendall(b"stats\n")
            print(c.recv(64).decode().strip())
    elif mode == "hold":
        with socket.create_connection((args[0], int(args[1])), timeout=2) as c:
            c.settimeout(10)
            print("connected", flush=True)
            try:
                end = "closed" if not c.recv(64) else "data"
            except OSError as exc:
                end = type(exc).__name__
            print(end, flush=True)
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
