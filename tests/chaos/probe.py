"""Test helper run inside a namespace: `serve PORT` accepts and closes connections forever;
`connect IP PORT [N]` prints the milliseconds of N connects (exit 1 if any fails)."""

from __future__ import annotations

import socket
import sys
import time


def main() -> int:
    if sys.argv[1] == "serve":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", int(sys.argv[2])))
        s.listen(64)
        print("ready", flush=True)
        while True:
            c, _ = s.accept()
            c.close()
    ip, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1
    out = []
    for _ in range(n):
        t = time.monotonic()
        try:
            socket.create_connection((ip, port), timeout=0.6).close()
        except OSError:
            return 1
        out.append(round((time.monotonic() - t) * 1000, 1))
    print(" ".join(map(str, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
