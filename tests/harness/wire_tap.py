"""A TCP relay that records what crosses it: the tests' view of the wire between two processes
(which bytes a node sends a peer, before any of our code decodes them).

Test equipment, not a mock: it forwards real connections unchanged. Threads, bounded by its
record cap; every wait in it ends when the relay is closed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Stream:
    """One direction of one relayed connection: the bytes it carried, up to the tap's cap."""

    data: bytearray = field(default_factory=bytearray)
    total: int = 0


class WireTap:
    """Listens on `listen` ("host:port") and relays each connection to `target`, keeping the
    first `cap` bytes of each direction (to_target: what the connecting side sent)."""

    def __init__(self, listen: str, target: str, cap: int = 8 << 20) -> None:
        host, _, port = listen.rpartition(":")
        self._target = target.rpartition(":")[0], int(target.rpartition(":")[2])
        self._cap = cap
        self._server = socket.create_server((host, int(port)))
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.streams: list[tuple[Stream, Stream]] = []  # (to_target, from_target) per connection
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"tap-{port}").start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                b = socket.create_connection(self._target, timeout=5)
            except OSError:
                a.close()  # the target is down: as if it were
                continue
            b.settimeout(None)
            up, down = Stream(), Stream()
            with self._lock:
                if self._closed:
                    a.close()
                    b.close()
                    return
                self._socks += [a, b]
                self.streams.append((up, down))
            threading.Thread(target=self._pump, args=(a, b, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(b, a, down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: Stream) -> None:
        try:
            while chunk := src.recv(65536):
                with self._lock:
                    room = self._cap - len(record.data)
                    if room > 0:
                        record.data += chunk[:room]
                    record.total += len(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # either side gone: the relayed connection is gone
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def snapshot(self) -> list[tuple[bytes, bytes]]:
        """(to_target, from_target) bytes of every connection so far."""
        with self._lock:
            return [(bytes(u.data), bytes(d.data)) for u, d in self.streams]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = list(self._socks)
        with contextlib.suppress(OSError):  # wakes the accept() blocked in its thread
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        for s in socks:
            s.close()
